package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/kafkatest"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/outbox"
)

// BenchmarkRelay measures events per second from committed outbox rows to acknowledged
// Kafka records (acks=all) and marked rows. Each iteration enqueues 10,000 rows, then times
// the relay draining them.
func BenchmarkRelay(b *testing.B) {
	const rows = 10000
	db := pgtest.New(b)
	bundle := &relayBundle{db: db, store: outbox.New(&outbox.Config{Schema: db.Schema})}
	bundle.topic = kafkatest.Topic(b, 4)
	ctx := context.Background()
	var total time.Duration
	for i := 0; i < b.N; i++ {
		events := make([]outbox.Event, rows)
		for j := range events {
			events[j] = outbox.Event{Topic: bundle.topic, Key: []byte(fmt.Sprintf("k%d", j%64)), Payload: make([]byte, 256),
				Pipeline: "bench", CausationID: fmt.Sprintf("%d-%d", i, j)}
		}
		tx, err := db.Pool.Begin(ctx)
		require.NoError(b, err)
		require.NoError(b, bundle.store.EnqueueTx(ctx, tx, events...))
		require.NoError(b, tx.Commit(ctx))

		start := time.Now()
		r, stop := bundle.startRelay(b, outbox.RelayConfig{BatchSize: 2000})
		r.TestSignals().Leading.Wait(b)
		require.NoError(b, r.Drain(ctx))
		total += time.Since(start)
		require.NoError(b, stop())
	}
	b.ReportMetric(float64(b.N*rows)/total.Seconds(), "events/s")
}

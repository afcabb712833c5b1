package outbox_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/outbox"
)

// BenchmarkEnqueue writes 500 events that share their headers, as a subscription's batch
// does, in a transaction rolled back after each round: what the outbox insert costs the
// client and PostgreSQL together (the server's time shows in the round trip).
func BenchmarkEnqueue(b *testing.B) {
	db := pgtest.New(b)
	store := outbox.New(&outbox.Config{Schema: db.Schema})
	ctx := context.Background()
	headers := map[string]string{"content-type": "application/json"}
	events := make([]outbox.Event, 500)
	for i := range events {
		events[i] = outbox.Event{Topic: "t", Pipeline: "p", CausationID: fmt.Sprintf("evt_%06d", i), Headers: headers,
			Payload: fmt.Appendf(nil, `{"id":"evt_%06d","type":"payment.succeeded","amount":%d,"currency":"eur","customer":"cus_%d"}`, i, i*100, i%97)}
	}
	b.ReportAllocs()
	for b.Loop() {
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := store.EnqueueTx(ctx, tx, events...); err != nil {
			b.Fatal(err)
		}
		if err := tx.Rollback(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*len(events)), "µs/event")
}

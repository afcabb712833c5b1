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
// client and PostgreSQL together (the server's time shows in the round trip), and the
// backend's CPU alone (pg-µs/event) when the server runs on this machine.
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
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	b.ReportAllocs()
	server := pgtest.StartBackendCPU(conn.Conn())
	for b.Loop() {
		tx, err := conn.Begin(ctx)
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
	server.Report(b, b.N*len(events), "event")
}

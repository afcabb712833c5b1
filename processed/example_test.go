package processed_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/processed"
)

// Apply a payment exactly once, however many times the webhook carrying it arrives: the
// claim and the effect commit in one transaction.
func Example() {
	ctx := context.Background()
	// The tables: migrations.Apply creates them (idemd migrate does the same). This example
	// uses a throwaway schema of the test database.
	pool, schema, cleanup := pgtest.ExampleDB("processed")
	defer cleanup()
	store, _ := processed.New(&processed.Config{Schema: schema}) // processed.ClaimTx uses schema "idemd"
	_, _ = pool.Exec(ctx, "CREATE TABLE "+schema+".payments (event_id text PRIMARY KEY, amount bigint)")

	apply := func(eventID string, body []byte) string {
		tx, err := pool.Begin(ctx)
		if err != nil {
			log.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit

		rec, err := store.ClaimTx(ctx, tx, "stripe", eventID, processed.Fingerprint(body))
		switch {
		case errors.Is(err, processed.ErrDuplicate):
			return "duplicate of the delivery of " + rec.MessageID
		case errors.Is(err, processed.ErrConflict):
			return "conflict: same id, different payload"
		case err != nil:
			log.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+schema+".payments VALUES ($1, 1000)", eventID); err != nil {
			log.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			log.Fatal(err)
		}
		return "applied"
	}

	fmt.Println(apply("evt_1", []byte(`{"id":"evt_1","amount":1000}`)))
	fmt.Println(apply("evt_1", []byte(`{"amount": 1000, "id": "evt_1"}`))) // same document, other key order
	fmt.Println(apply("evt_1", []byte(`{"id":"evt_1","amount":9999}`)))
	var n int
	_ = pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".payments").Scan(&n)
	fmt.Println("payments:", n)
	// Output:
	// applied
	// duplicate of the delivery of evt_1
	// conflict: same id, different payload
	// payments: 1
}

package outbox_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/outbox"
)

// Write an order and the event announcing it in one transaction: the event exists if and
// only if the order does, and its operation id is the same however often this runs.
func ExampleStore_EnqueueTx() {
	ctx := context.Background()
	pool, schema, cleanup := pgtest.ExampleDB("outbox")
	defer cleanup()
	store := outbox.New(&outbox.Config{Schema: schema})

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	// ... the order's own INSERT goes here, in tx ...
	err = store.EnqueueTx(ctx, tx, outbox.Event{
		Topic:       "orders.created",
		Key:         []byte("order-42"),
		Payload:     []byte(`{"order":42}`),
		Headers:     map[string]string{outbox.HeaderContentType: "application/json"},
		Pipeline:    "orders",
		CausationID: "req-7f3a", // the inbound message id
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}

	var op string
	_ = pool.QueryRow(ctx, "SELECT operation_id::text FROM "+pgx.Identifier{schema}.Sanitize()+".outbox").Scan(&op)
	fmt.Println(op == outbox.OperationID("orders", "req-7f3a", 0).String())
	// Output: true
}

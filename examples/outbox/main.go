// Command outbox writes an order and the event announcing it in one transaction with
// outbox.EnqueueTx: the event exists if and only if the order does, and its operation id is
// the same however often the transaction is retried. idemd's relay (idemd serve, or
// outbox.NewRelay) then publishes it. Run it with IDEMD_DATABASE_URL set.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/migrations"
	"github.com/idemd/idemd/outbox"
)

func main() {
	ctx := context.Background()
	url := os.Getenv("IDEMD_DATABASE_URL")
	if url == "" { // pgx would fall back to libpq's defaults: some other database
		log.Fatal("set IDEMD_DATABASE_URL, for example postgres://postgres@127.0.0.1:5432/test")
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	// The tables of schema "idemd", which the package-level functions use.
	if err := migrations.Apply(ctx, pool, &migrations.Config{}); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS example_orders (request_id text PRIMARY KEY, body jsonb)`); err != nil {
		log.Fatal(err)
	}

	var b [4]byte
	_, _ = rand.Read(b[:])
	requestID := "req-" + hex.EncodeToString(b[:]) // the inbound message id
	body := []byte(`{"order":42}`)

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if _, err := tx.Exec(ctx, `INSERT INTO example_orders VALUES ($1, $2)`, requestID, body); err != nil {
		log.Fatal(err)
	}
	err = outbox.EnqueueTx(ctx, tx, outbox.Event{
		Topic:       "orders.created",
		Key:         []byte("order-42"),
		Payload:     body,
		Headers:     map[string]string{outbox.HeaderContentType: "application/json"},
		Pipeline:    "orders",
		CausationID: requestID,
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}

	var op string
	if err := pool.QueryRow(ctx, `SELECT operation_id::text FROM idemd.outbox WHERE causation_id = $1`, requestID).Scan(&op); err != nil {
		log.Fatal(err)
	}
	fmt.Println("event written with operation id", op)
	fmt.Println("deterministic:", op == outbox.OperationID("orders", requestID, 0).String())
}

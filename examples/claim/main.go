// Command claim applies a payment exactly once however many times its webhook arrives:
// processed.ClaimTx claims the event id in the transaction of the effect, so both commit or
// neither does. Run it with IDEMD_DATABASE_URL set.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/migrations"
	"github.com/idemd/idemd/processed"
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
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS example_payments (event_id text PRIMARY KEY, body jsonb)`); err != nil {
		log.Fatal(err)
	}

	var b [4]byte
	_, _ = rand.Read(b[:])
	id := "evt_" + hex.EncodeToString(b[:]) // a new id per run; a webhook carries its own
	for _, body := range []string{
		`{"id":"` + id + `","amount":1000}`,
		`{"amount": 1000, "id": "` + id + `"}`, // the same document: a duplicate
		`{"id":"` + id + `","amount":9999}`,    // the same id, another payload: a conflict
	} {
		outcome, err := apply(ctx, pool, id, []byte(body))
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(outcome)
	}
	var conflicts int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idemd.conflicts WHERE message_id = $1`, id).Scan(&conflicts); err != nil {
		log.Fatal(err)
	}
	fmt.Println("conflicts recorded:", conflicts)
}

// apply runs the effect of one delivery, once per id.
func apply(ctx context.Context, pool *pgxpool.Pool, id string, body []byte) (string, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return "", err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit

	// The fingerprint is required: it tells a duplicate from a conflict.
	rec, err := processed.ClaimTx(ctx, tx, "stripe", id, processed.Fingerprint(body))
	switch {
	case errors.Is(err, processed.ErrDuplicate):
		return "duplicate of the delivery received at " + rec.ReceivedAt.Format("15:04:05"), nil
	case errors.Is(err, processed.ErrConflict):
		// Already recorded for investigation, whatever happens to tx: refuse the delivery.
		return "conflict: same id, different payload", nil
	case err != nil:
		return "", err // in flight or a database error: let the sender retry
	}
	if _, err := tx.Exec(ctx, `INSERT INTO example_payments VALUES ($1, $2)`, id, body); err != nil {
		return "", err
	}
	return "applied", tx.Commit(ctx)
}

package outbox

import (
	"cmp"
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// The outbox is a queue: the relay deletes each row once the broker has it (or moves it to
// outbox_published), so the head of its primary key is made of dead index entries until a
// VACUUM removes them, and its statistics are always stale. A plain index scan steps over
// the dead entries cheaply once a first scan has marked them dead (about 1 ms per round
// with 160,000 of them), but the planner, whose statistics still count them as rows,
// prefers a bitmap scan, which never marks them and visits every one of their heap pages on
// every round (7-15 ms per round with the same 160,000, EXPLAIN ANALYZE); and with
// statistics from a nearly empty table (the last ANALYZE after a quiet spell) it picks a
// sequential scan, which reads every dead row, for the relay's deletes and its check for
// older rows alike (BENCHMARKS.md, phase 17: since the outbox lost its partial index the
// primary key is its only index). The relay's statements therefore run with sequential and
// bitmap scans off, for their own transaction only: the settings are local to the
// transaction (set_config's is_local), the implicit one of a pipeline or the relay's own,
// and never reach the pool's session. Every statement of the relay finds its rows by id.
const byIndex = `SELECT set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true)`

// queryByIndex runs sql with args by index (see above). done releases the connection; call
// it after the rows are read.
func queryByIndex(ctx context.Context, db interface {
	SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
}, sql string, args ...any) (rows pgx.Rows, done func() error, err error) {
	br := db.SendBatch(ctx, batchByIndex(sql, args))
	if _, err := br.Exec(); err != nil {
		return nil, nil, errors.Join(err, br.Close())
	}
	rows, err = br.Query()
	if err != nil {
		return nil, nil, errors.Join(err, br.Close())
	}
	return rows, br.Close, nil
}

// queryRowByIndex runs sql with args by index (see above) and scans its first row into
// dest; a statement that returns no row leaves dest as it was.
func queryRowByIndex(ctx context.Context, db interface {
	SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
}, sql string, args []any, dest ...any) error {
	rows, done, err := queryByIndex(ctx, db, sql, args...)
	if err != nil {
		return err
	}
	if rows.Next() {
		err = rows.Scan(dest...)
	}
	rows.Close()
	return cmp.Or(err, rows.Err(), done())
}

// execByIndex runs sql with args by index (see above).
func execByIndex(ctx context.Context, db interface {
	SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
}, sql string, args ...any) error {
	return db.SendBatch(ctx, batchByIndex(sql, args)).Close()
}

// batchByIndex is sql with args after the settings, in one pipeline.
func batchByIndex(sql string, args []any) *pgx.Batch {
	b := &pgx.Batch{}
	b.Queue(byIndex)
	b.Queue(sql, args...)
	return b
}

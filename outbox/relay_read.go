package outbox

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// The outbox is a queue: the relay deletes each row once the broker has it, and marked rows
// (KeepPublished) leave the unpublished index too, so its head is made of dead index entries
// until a VACUUM removes them. A plain index scan steps over them cheaply once a first scan
// has marked them dead (about 1 ms per round with 160,000 of them), but the planner, whose
// statistics still count them as rows, prefers a bitmap scan, which never marks them and
// visits every one of their heap pages on every round (7-15 ms per round with the same
// 160,000, EXPLAIN ANALYZE). The round's select therefore runs with bitmap scans off, for
// its own statement only: the setting is local to the implicit transaction of a pipeline
// that ends with the select (set_config's is_local), and never reaches the pool's session.
const noBitmapScan = `SELECT set_config('enable_bitmapscan', 'off', true)`

// queryNoBitmap runs sql with args with bitmap scans off (see above). done releases the
// connection; call it after the rows are read.
func queryNoBitmap(ctx context.Context, db interface {
	SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
}, sql string, args ...any) (rows pgx.Rows, done func() error, err error) {
	b := &pgx.Batch{}
	b.Queue(noBitmapScan)
	b.Queue(sql, args...)
	br := db.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		return nil, nil, errors.Join(err, br.Close())
	}
	rows, err = br.Query()
	if err != nil {
		return nil, nil, errors.Join(err, br.Close())
	}
	return rows, br.Close, nil
}

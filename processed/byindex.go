package processed

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/pgarray"
)

// idemd's statements on processed_messages find their rows by the primary key (or by the
// expires_at index, when pruning), whatever the statistics say. A generic plan is made once
// per connection and kept until the statistics or the table change. Made while a partition
// looked small (a new epoch, never analyzed yet, or one analyzed when nearly empty), it
// reads the whole partition by a sequential scan, and keeps doing so as the partition grows
// until the next ANALYZE: the probe of older epochs, the lookup of known ids and the
// completion of reservations then cost a partition each, and the pruner's statements a
// partition per round (BENCHMARKS.md, phase 27: 8 M and 19 M rows read so in two bench
// runs whose statistics were an empty table's). So these statements run with sequential
// and bitmap scans off, which only steers the planner (a statement with no index path still
// runs). In a claim's transaction the settings then go back to the session's defaults, so
// that the effects' SQL that follows is planned as the server would plan it. The settings
// are local to the transaction.

// scansOff turns the scans off for the rest of the transaction.
const scansOff = `set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true)`

// scansRestore are the statements that give the scans back their session defaults.
var scansRestore = [...]string{`SET LOCAL enable_seqscan TO DEFAULT`, `SET LOCAL enable_bitmapscan TO DEFAULT`}

// queueScansOff queues scansOff as a statement of its own.
func queueScansOff(b *pgx.Batch) { b.Queue(`SELECT ` + scansOff) }

// queueScansRestore queues scansRestore.
func queueScansRestore(b *pgx.Batch) {
	for _, q := range scansRestore {
		b.Queue(q)
	}
}

// sendByIndex sends the statements queue puts on a batch, in one round trip, with the
// scans off around them.
func sendByIndex(ctx context.Context, tx pgx.Tx, queue func(*pgx.Batch)) error {
	b := &pgx.Batch{}
	queueScansOff(b)
	queue(b)
	queueScansRestore(b)
	pgarray.Reserve(tx.Conn(), b)
	return tx.SendBatch(ctx, b).Close()
}

// poolByIndex sends the statement queue puts on a batch to pool with the scans off, in the
// implicit transaction of one pipeline (the pruner's statements: nothing follows them).
func poolByIndex(ctx context.Context, pool *pgxpool.Pool, queue func(*pgx.Batch)) error {
	b := &pgx.Batch{}
	queueScansOff(b)
	queue(b)
	return pool.SendBatch(ctx, b).Close()
}

// execByIndex runs sql with args on pool with the scans off (poolByIndex).
func execByIndex(ctx context.Context, pool *pgxpool.Pool, sql string, args ...any) (pgconn.CommandTag, error) {
	var tag pgconn.CommandTag
	err := poolByIndex(ctx, pool, func(b *pgx.Batch) { queueExec(b, &tag, sql, args...) })
	return tag, err
}

// queueExec queues sql with args on b, its command tag read into tag.
func queueExec(b *pgx.Batch, tag *pgconn.CommandTag, sql string, args ...any) {
	b.Queue(sql, args...).Exec(func(t pgconn.CommandTag) error {
		*tag = t
		return nil
	})
}

package processed

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// idemd's statements on processed_messages find their rows by the primary key (or by the
// expires_at index, when pruning), whatever the statistics say. A generic plan is made once
// per connection and kept until the statistics or the table change; made while a partition
// looked small (a new epoch, never analyzed yet, or one analyzed when nearly empty), it
// reads the whole partition by a sequential scan, and keeps doing so as the partition
// grows, until the next ANALYZE: the probe of older epochs, the lookup of known ids and the
// completion of reservations then cost a partition each (BENCHMARKS.md, phase 27: 8 M and
// 19 M rows read so in two bench runs whose statistics were an empty table's). So these
// statements run with sequential and bitmap scans off, which only steers the planner (a
// statement with no index path still runs), and then the transaction's settings go back
// to the session's defaults: the effects' SQL that follows in the same transaction is
// planned as the server would plan it. The settings are local to the transaction.

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
	return tx.SendBatch(ctx, b).Close()
}

package processed

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// A message that the stale-event guard skipped is recorded done, as an applied one is: a
// redelivery of it is a duplicate, and retention, pruning and epochs treat its record
// alike. Only its stale columns (migration 0010) tell it apart, for the operators' reads
// (Record.Stale); they are written for such a message alone, in the transaction that
// records it, so that an applied message pays nothing for them.

// QueueStale queues on batch the statements that mark the record of (scope, id), claimed
// in batch's transaction, as skipped by the stale-event guard (Record.Stale), for the
// caller to send with the rest of its work. Its row is found by the primary key whatever
// the statistics say (byindex.go); the scans are given back their defaults after it.
func (s *Store) QueueStale(batch *pgx.Batch, scope, id string, st Stale) {
	queueScansOff(batch)
	batch.Queue(s.sql.stale, scope, id, st.Entity, st.Version)
	queueScansRestore(batch)
}

// MarkStaleTx marks the record of (scope, id), claimed in tx (or held by tx: a reservation,
// a dead letter's record being replayed), as skipped by the stale-event guard: QueueStale,
// sent at once.
func (s *Store) MarkStaleTx(ctx context.Context, tx pgx.Tx, scope, id string, st Stale) error {
	b := &pgx.Batch{}
	s.QueueStale(b, scope, id, st)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("error marking the message stale: %w", err)
	}
	return nil
}

package processed

import (
	"cmp"
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PruneBatchDefault is how many rows one prune statement deletes at most.
const PruneBatchDefault = 1000

// Prune deletes expired records (PruneRecords) and expired conflicts (PruneConflicts). It
// returns how many records it deleted.
func (s *Store) Prune(ctx context.Context, pool *pgxpool.Pool, batchSize int) (int64, error) {
	total, err := s.PruneRecords(ctx, pool, batchSize)
	if err != nil {
		return total, err
	}
	return total, s.PruneConflicts(ctx, pool, batchSize)
}

// PruneRecords deletes expired records, row by row, in batches of at most batchSize rows,
// each batch its own short transaction, until none is left or ctx ends; it goes through
// every epoch's partition. It returns how many records it deleted. A record is expired when
// its retention has passed; an in-flight reservation is kept while its lease is live.
// With epochs opened at an interval, DropExpiredEpochs is the pruning that writes nothing
// per record.
func (s *Store) PruneRecords(ctx context.Context, pool *pgxpool.Pool, batchSize int) (int64, error) {
	batchSize = cmp.Or(batchSize, PruneBatchDefault)
	rows, err := pool.Query(ctx, `SELECT epoch FROM `+s.table("processed_epochs")+` ORDER BY epoch`)
	if err != nil {
		return 0, fmt.Errorf("error pruning processed messages: %w", err)
	}
	epochs, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return 0, fmt.Errorf("error pruning processed messages: %w", err)
	}
	var total int64
	for _, epoch := range epochs {
		q := pruneSQL(s.partition(epoch))
		for {
			tag, err := pool.Exec(ctx, q, batchSize)
			if err != nil {
				return total, fmt.Errorf("error pruning processed messages: %w", err)
			}
			total += tag.RowsAffected()
			if tag.RowsAffected() < int64(batchSize) {
				break
			}
		}
	}
	return total, nil
}

// PruneConflicts deletes expired conflicts (kept for their record's retention), in batches
// of at most batchSize rows.
func (s *Store) PruneConflicts(ctx context.Context, pool *pgxpool.Pool, batchSize int) error {
	batchSize = cmp.Or(batchSize, PruneBatchDefault)
	for _, q := range []string{s.sql.pruneConflictsExpired, s.sql.pruneConflicts} {
		for {
			args := []any{batchSize}
			if q == s.sql.pruneConflicts {
				args = append(args, s.retention.Microseconds())
			}
			tag, err := pool.Exec(ctx, q, args...)
			if err != nil {
				return fmt.Errorf("error pruning conflicts: %w", err)
			}
			if tag.RowsAffected() < int64(batchSize) {
				break
			}
		}
	}
	return nil
}

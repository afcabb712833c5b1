package processed

import (
	"cmp"
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
)

// PruneBatchDefault is how many rows one prune statement deletes at most.
const PruneBatchDefault = 1000

// Prune deletes expired records and expired conflicts (kept for their record's retention) in batches of at most batchSize rows, each
// batch its own short transaction, until none is left or ctx ends. It returns how many
// records it deleted. A record is expired when its retention has passed; an in-flight
// reservation is kept while its lease is live.
func (s *Store) Prune(ctx context.Context, pool *pgxpool.Pool, batchSize int) (int64, error) {
	batchSize = cmp.Or(batchSize, PruneBatchDefault)
	var total int64
	for {
		tag, err := pool.Exec(ctx, s.sql.prune, batchSize)
		if err != nil {
			return total, fmt.Errorf("error pruning processed messages: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batchSize) {
			break
		}
	}
	for _, q := range []string{s.sql.pruneConflictsExpired, s.sql.pruneConflicts} {
		for {
			args := []any{batchSize}
			if q == s.sql.pruneConflicts {
				args = append(args, s.retention.Microseconds())
			}
			tag, err := pool.Exec(ctx, q, args...)
			if err != nil {
				return total, fmt.Errorf("error pruning conflicts: %w", err)
			}
			if tag.RowsAffected() < int64(batchSize) {
				break
			}
		}
	}
	return total, nil
}

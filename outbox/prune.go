package outbox

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PruneBatchDefault is how many rows one prune statement deletes at most.
const PruneBatchDefault = 1000

// PrunePublished deletes rows published more than retention ago, at most batchSize per
// statement, each statement its own short transaction, until none is left or ctx ends.
// Unpublished rows are never touched.
func (s *Store) PrunePublished(ctx context.Context, pool *pgxpool.Pool, retention time.Duration, batchSize int) (int64, error) {
	batchSize = cmp.Or(batchSize, PruneBatchDefault)
	// Kept published rows are in outbox_published (migration 0008); the outbox holds only
	// the rows still to publish.
	table := pgx.Identifier{s.schema}.Sanitize() + ".outbox_published"
	sql := `DELETE FROM ` + table + ` WHERE id = ANY (ARRAY(
    SELECT id FROM ` + table + `
    WHERE published_at <= now() - $2::bigint * interval '1 microsecond'
    ORDER BY published_at LIMIT $1
    FOR UPDATE SKIP LOCKED))`
	var total int64
	for {
		tag, err := pool.Exec(ctx, sql, batchSize, retention.Microseconds())
		if err != nil {
			return total, fmt.Errorf("error pruning published outbox rows: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batchSize) {
			return total, nil
		}
	}
}

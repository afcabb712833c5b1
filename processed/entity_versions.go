package processed

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PruneEntityVersions deletes the stale-event guard's versions of entities that no message
// updated for olderThan, in batches of at most batchSize rows, each its own statement. An
// entity whose version is gone has no guard until its next message: a message older than
// the last applied one, arriving after olderThan, would be applied. Keep olderThan longer
// than the pipelines' retention (after which such a message counts as new anyway).
func (s *Store) PruneEntityVersions(ctx context.Context, pool *pgxpool.Pool, olderThan time.Duration, batchSize int) (int64, error) {
	batchSize = cmp.Or(batchSize, PruneBatchDefault)
	t := pgx.Identifier{s.schema}.Sanitize() + ".entity_versions"
	q := `DELETE FROM ` + t + ` WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM ` + t + ` WHERE updated_at <= now() - $2::bigint * interval '1 microsecond'
    ORDER BY updated_at LIMIT $1 FOR UPDATE SKIP LOCKED))`
	var total int64
	for {
		tag, err := pool.Exec(ctx, q, batchSize, olderThan.Microseconds())
		if err != nil {
			return total, fmt.Errorf("error pruning entity versions: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batchSize) {
			return total, nil
		}
	}
}

package deadletter

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Retention of dead letters, used when the caller gives none.
const (
	// RetentionDefault: every letter, replayed or not, is deleted this long after it was
	// written.
	RetentionDefault = 30 * 24 * time.Hour
	// ReplayedRetentionDefault: a replayed letter is deleted this long after its replay.
	ReplayedRetentionDefault = 7 * 24 * time.Hour
	// PruneBatchDefault is how many letters one prune statement deletes at most.
	PruneBatchDefault = 1000
)

// Prune deletes letters replayed more than replayed ago, and letters written more than
// retention ago whether replayed or not, at most batchSize per statement (each its own short
// transaction), until none is left or ctx ends. Zero durations take the defaults. A letter
// being replayed is locked, and skipped until the next round.
func (s *Store) Prune(ctx context.Context, pool *pgxpool.Pool, retention, replayed time.Duration, batchSize int) (int64, error) {
	batchSize = cmp.Or(batchSize, PruneBatchDefault)
	retention = cmp.Or(retention, RetentionDefault)
	replayed = cmp.Or(replayed, ReplayedRetentionDefault)
	queries := []struct {
		column string
		age    time.Duration
	}{{"replayed_at", replayed}, {"created_at", retention}}
	var total int64
	for _, q := range queries {
		sql := `DELETE FROM ` + s.table + ` WHERE id = ANY (ARRAY(
    SELECT id FROM ` + s.table + ` WHERE ` + q.column + ` <= now() - $2::bigint * interval '1 microsecond'
    ORDER BY ` + q.column + ` LIMIT $1 FOR UPDATE SKIP LOCKED))`
		for {
			tag, err := pool.Exec(ctx, sql, batchSize, q.age.Microseconds())
			if err != nil {
				return total, fmt.Errorf("error pruning dead letters: %w", err)
			}
			total += tag.RowsAffected()
			if tag.RowsAffected() < int64(batchSize) {
				break
			}
		}
	}
	return total, nil
}

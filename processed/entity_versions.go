package processed

import (
	"cmp"
	"context"
	"errors"
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

// EntityVersion is the last version of an entity that the stale-event guard let through.
type EntityVersion struct {
	// Version is a decimal number (an RFC 3339 time is in microseconds since the Unix epoch).
	Version string
	// MessageID is the message that applied it.
	MessageID string
	UpdatedAt time.Time
}

// GetEntityVersion returns the last applied version of entity in scope (the guard's scope:
// the pipeline's name, for idemd's doors), or nil when none is kept: never applied, or
// pruned (PruneEntityVersions).
func (s *Store) GetEntityVersion(ctx context.Context, pool *pgxpool.Pool, scope, entity string) (*EntityVersion, error) {
	var v EntityVersion
	err := pool.QueryRow(ctx, `SELECT version::text, message_id, updated_at FROM `+pgx.Identifier{s.schema, "entity_versions"}.Sanitize()+`
WHERE scope = $1 AND entity = $2`, scope, entity).Scan(&v.Version, &v.MessageID, &v.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("error reading the version of entity %q: %w", entity, err)
	}
	return &v, nil
}

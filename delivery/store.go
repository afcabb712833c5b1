package delivery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/migrations"
	"github.com/idemd/idemd/outbox"
)

// ErrNotFound: no endpoint or delivery has that name or id.
var ErrNotFound = errors.New("delivery: not found")

// PruneBatchDefault is how many rows one prune statement deletes at most.
const PruneBatchDefault = 1000

// Store holds the operator's functions on delivery state in one schema.
type Store struct {
	schema     string
	deliveries string
	endpoints  string
}

// NewStore returns a Store on schema ("" means "idemd").
func NewStore(schema string) *Store {
	schema = cmp.Or(schema, migrations.SchemaDefault)
	q := pgx.Identifier{schema}.Sanitize()
	return &Store{schema: schema, deliveries: q + ".http_deliveries", endpoints: q + ".http_endpoints"}
}

// Enable re-enables an endpoint disabled by a 410 Gone answer; its queued events are then
// delivered in order. Running deliverers notice at once (NOTIFY) or within their poll
// interval. The same in SQL:
//
//	UPDATE idemd.http_endpoints SET disabled_at = NULL, disabled_reason = NULL WHERE name = 'x';
func (s *Store) Enable(ctx context.Context, pool *pgxpool.Pool, name string) error {
	tag, err := pool.Exec(ctx, `UPDATE `+s.endpoints+` SET disabled_at = NULL, disabled_reason = NULL, updated_at = now() WHERE name = $1`, name)
	if err != nil {
		return fmt.Errorf("error enabling endpoint %q: %w", name, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("endpoint %q: %w", name, ErrNotFound)
	}
	s.notify(ctx, pool)
	return nil
}

// Disabled reports whether an endpoint is disabled, and why.
func (s *Store) Disabled(ctx context.Context, pool *pgxpool.Pool, name string) (disabled bool, reason string, err error) {
	var r *string
	err = pool.QueryRow(ctx, `SELECT disabled_at IS NOT NULL, disabled_reason FROM `+s.endpoints+` WHERE name = $1`, name).Scan(&disabled, &r)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, "", nil
	}
	if err != nil {
		return false, "", fmt.Errorf("error reading endpoint %q: %w", name, err)
	}
	if r != nil {
		reason = *r
	}
	return disabled, reason, nil
}

// Requeue makes a dead (dead-lettered) or delivered delivery pending again, with a fresh
// attempt budget and the same operation id, so the endpoint can recognise it if it had in
// fact received it. The dead-letter record, if any, stays for the record. The same in SQL:
//
//	UPDATE idemd.http_deliveries SET state = 'pending', attempts = 0, next_attempt_at = now(),
//	    created_at = now(), finished_at = NULL WHERE id = 42;
func (s *Store) Requeue(ctx context.Context, pool *pgxpool.Pool, id int64) error {
	tag, err := pool.Exec(ctx, `UPDATE `+s.deliveries+` SET state = 'pending', attempts = 0, next_attempt_at = now(),
    created_at = now(), finished_at = NULL, lease_until = NULL, lease_token = NULL WHERE id = $1`, id)
	if err != nil {
		return fmt.Errorf("error requeueing delivery %d: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("delivery %d: %w", id, ErrNotFound)
	}
	s.notify(ctx, pool)
	return nil
}

// ErrPending: the delivery is still pending (queued or in flight); requeueing it could send
// it twice.
var ErrPending = errors.New("delivery: still pending")

// RequeueTx is Requeue in the caller's transaction, for a delivery that is finished (dead or
// delivered) only: a pending one is refused with ErrPending, since clearing its lease could
// send it twice. The deliverers are woken when tx commits.
func (s *Store) RequeueTx(ctx context.Context, tx pgx.Tx, id int64) error {
	var state string
	err := tx.QueryRow(ctx, `SELECT state FROM `+s.deliveries+` WHERE id = $1 FOR UPDATE`, id).Scan(&state)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("delivery %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("error requeueing delivery %d: %w", id, err)
	}
	if state == "pending" {
		return fmt.Errorf("delivery %d: %w", id, ErrPending)
	}
	if _, err := tx.Exec(ctx, `UPDATE `+s.deliveries+` SET state = 'pending', attempts = 0, next_attempt_at = now(),
    created_at = now(), finished_at = NULL, lease_until = NULL, lease_token = NULL WHERE id = $1`, id); err != nil {
		return fmt.Errorf("error requeueing delivery %d: %w", id, err)
	}
	// Delivered at commit, not before: a rolled-back requeue wakes nobody.
	if _, err := tx.Exec(ctx, "SELECT pg_notify($1, '')", outbox.DeliveryChannel(s.schema)); err != nil {
		return fmt.Errorf("error requeueing delivery %d: %w", id, err)
	}
	return nil
}

// PruneFinished deletes delivered and dead deliveries finished more than retention ago,
// at most batchSize per statement, until none is left or ctx ends. Pending rows are never
// touched.
func (s *Store) PruneFinished(ctx context.Context, pool *pgxpool.Pool, retention time.Duration, batchSize int) (int64, error) {
	batchSize = cmp.Or(batchSize, PruneBatchDefault)
	sql := `DELETE FROM ` + s.deliveries + ` WHERE id = ANY (ARRAY(
    SELECT id FROM ` + s.deliveries + `
    WHERE state <> 'pending' AND finished_at <= now() - $2::bigint * interval '1 microsecond'
    ORDER BY finished_at LIMIT $1
    FOR UPDATE SKIP LOCKED))`
	var total int64
	for {
		tag, err := pool.Exec(ctx, sql, batchSize, retention.Microseconds())
		if err != nil {
			return total, fmt.Errorf("error pruning finished deliveries: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batchSize) {
			return total, nil
		}
	}
}

// notify wakes the deliverers; a lost notification only costs a poll interval.
func (s *Store) notify(ctx context.Context, pool *pgxpool.Pool) {
	_, _ = pool.Exec(ctx, "SELECT pg_notify($1, '')", outbox.DeliveryChannel(s.schema))
}

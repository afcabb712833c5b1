package admin

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/idemd/idemd/migrations"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Audit actions.
const (
	ActionReplay          = "dead_letter.replay"
	ActionEndpointDisable = "endpoint.disable"
	ActionEndpointEnable  = "endpoint.enable"
	ActionDeliveryRequeue = "delivery.requeue"
)

// Audit outcomes.
const (
	OutcomeDone    = "done"
	OutcomeSkipped = "skipped"
	OutcomeFailed  = "failed"
)

// Audit is the admin_audit table: one row per write made through the admin API or console.
type Audit struct {
	table string
}

// NewAudit returns the audit table of schema ("" means "idemd").
func NewAudit(schema string) *Audit {
	return &Audit{table: pgx.Identifier{cmp.Or(schema, migrations.SchemaDefault)}.Sanitize() + ".admin_audit"}
}

// Entry is one audited write.
type Entry struct {
	At        time.Time `json:"at"`
	Actor     string    `json:"actor"`
	Action    string    `json:"action"`
	Target    string    `json:"target"`
	Outcome   string    `json:"outcome"`
	Detail    string    `json:"detail,omitempty"`
	RequestID uuid.UUID `json:"request_id"`
}

// Write records e (At is the database's clock).
func (a *Audit) Write(ctx context.Context, pool *pgxpool.Pool, e Entry) error {
	var req *uuid.UUID
	if e.RequestID != uuid.Nil {
		req = &e.RequestID
	}
	_, err := pool.Exec(ctx, `INSERT INTO `+a.table+` (actor, action, target, outcome, detail, request_id)
VALUES ($1, $2, $3, $4, nullif($5, ''), $6)`, e.Actor, e.Action, e.Target, e.Outcome, e.Detail, req)
	if err != nil {
		return fmt.Errorf("error writing the admin audit: %w", err)
	}
	return nil
}

// Of returns the entries of one target of an action, oldest first.
func (a *Audit) Of(ctx context.Context, pool *pgxpool.Pool, action, target string) ([]Entry, error) {
	rows, err := pool.Query(ctx, `SELECT at, actor, action, target, outcome, coalesce(detail, ''),
       coalesce(request_id, '00000000-0000-0000-0000-000000000000') FROM `+a.table+`
WHERE action = $1 AND target = $2 ORDER BY id`, action, target)
	if err != nil {
		return nil, fmt.Errorf("error reading the admin audit: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Entry, error) {
		var e Entry
		err := row.Scan(&e.At, &e.Actor, &e.Action, &e.Target, &e.Outcome, &e.Detail, &e.RequestID)
		return e, err
	})
}

// Prune deletes entries older than retention, at most batchSize per statement.
func (a *Audit) Prune(ctx context.Context, pool *pgxpool.Pool, retention time.Duration, batchSize int) (int64, error) {
	batchSize = cmp.Or(batchSize, 1000)
	var total int64
	for {
		tag, err := pool.Exec(ctx, `DELETE FROM `+a.table+` WHERE id = ANY (ARRAY(
    SELECT id FROM `+a.table+` WHERE at <= now() - $2::bigint * interval '1 microsecond'
    ORDER BY at LIMIT $1 FOR UPDATE SKIP LOCKED))`, batchSize, retention.Microseconds())
		if err != nil {
			return total, fmt.Errorf("error pruning the admin audit: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batchSize) {
			return total, nil
		}
	}
}

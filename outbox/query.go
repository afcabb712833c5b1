package outbox

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/sqlwhere"
)

// Operators' reads of the outbox (the admin API, `idemd inspect`).

// Row is one outbox row.
type Row struct {
	ID          int64
	OperationID uuid.UUID
	Pipeline    string
	CausationID string
	Topic       string
	Key         []byte
	Payload     []byte
	Headers     map[string]string
	CreatedAt   time.Time
	// PublishedAt is nil until the relay published the row.
	PublishedAt *time.Time
}

// RowFilter narrows Rows. Zero fields do not filter.
type RowFilter struct {
	Topic       string
	Pipeline    string
	OperationID uuid.UUID
	CausationID string
	// Unpublished keeps the rows not yet published.
	Unpublished bool
	// Published keeps the rows already published: those the relay keeps
	// (RelayConfig.KeepPublished) until the pruner deletes them; without it there are none.
	Published bool
	// AfterID continues a list after the row with this id (newest first).
	AfterID int64
	// Limit bounds the page. Defaults to 50.
	Limit int
}

// Rows returns outbox rows, newest first: the rows still to publish and, when the relay
// keeps them (RelayConfig.KeepPublished), the published ones, until the pruner deletes
// them after the outbox retention; by default a row is deleted once published.
func (s *Store) Rows(ctx context.Context, pool *pgxpool.Pool, f RowFilter) ([]*Row, error) {
	sql, args := s.rowsSQL(f)
	rows, err := pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("error listing outbox rows: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (*Row, error) {
		var r Row
		err := row.Scan(&r.ID, &r.OperationID, &r.Pipeline, &r.CausationID, &r.Topic, &r.Key, &r.Payload,
			&r.Headers, &r.CreatedAt, &r.PublishedAt)
		return &r, err
	})
}

// rowsSQL is Rows' statement and its arguments.
func (s *Store) rowsSQL(f RowFilter) (string, []any) {
	var w sqlwhere.Where
	if f.Topic != "" {
		w.Add("topic = ?", f.Topic)
	}
	if f.Pipeline != "" {
		w.Add("pipeline = ?", f.Pipeline)
	}
	if f.OperationID != uuid.Nil {
		w.Add("operation_id = ?", f.OperationID)
	}
	if f.CausationID != "" {
		w.Add("causation_id = ?", f.CausationID)
	}
	if f.Unpublished {
		w.Add("published_at IS NULL")
	}
	if f.Published {
		w.Add("published_at IS NOT NULL")
	}
	if f.AfterID > 0 {
		w.Add("id < ?", f.AfterID)
	}
	limit := w.Arg(cmp.Or(f.Limit, 50))
	const cols = `id, operation_id, pipeline, causation_id, topic, key, payload, headers, created_at, published_at`
	q := pgx.Identifier{s.schema}.Sanitize()
	from := q + ".outbox" + w.SQL()
	if !f.Unpublished {
		// The rows still to publish are in the outbox, read by its primary key; published
		// rows kept with KeepPublished are in outbox_published (migration 0008), indexed by
		// these ids. Each side gives its newest rows first, merged.
		from = `(SELECT ` + cols + ` FROM ` + q + `.outbox` + w.SQL() + `
UNION ALL
SELECT ` + cols + ` FROM ` + q + `.outbox_published` + w.SQL() + `) AS outbox`
	}
	return `SELECT ` + cols + `
FROM ` + from + ` ORDER BY id DESC LIMIT ` + limit, w.Args()
}

// TopicBacklog is the unpublished part of the outbox for one topic.
type TopicBacklog struct {
	Topic       string
	Unpublished int64
	// OldestID and OldestCreatedAt are those of the oldest unpublished row.
	OldestID        int64
	OldestCreatedAt time.Time
}

// Backlog returns the unpublished rows per topic, the topic with the oldest row first.
func (s *Store) Backlog(ctx context.Context, pool *pgxpool.Pool) ([]TopicBacklog, error) {
	rows, err := pool.Query(ctx, `SELECT topic, count(*), min(id), min(created_at)
FROM `+pgx.Identifier{s.schema}.Sanitize()+`.outbox WHERE published_at IS NULL
GROUP BY topic ORDER BY min(created_at), topic`)
	if err != nil {
		return nil, fmt.Errorf("error reading the outbox backlog: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (TopicBacklog, error) {
		var b TopicBacklog
		err := row.Scan(&b.Topic, &b.Unpublished, &b.OldestID, &b.OldestCreatedAt)
		return b, err
	})
}

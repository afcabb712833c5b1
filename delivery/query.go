package delivery

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

// Operators' reads and switches of delivery state (the admin API, `idemd inspect`).

// Delivery is one http_deliveries row, without its payload.
type Delivery struct {
	ID            int64
	Endpoint      string
	OperationID   uuid.UUID
	Pipeline      string
	CausationID   string
	State         string
	Attempts      int
	NextAttemptAt time.Time
	// LastStatus is the endpoint's last HTTP status (nil before an answer).
	LastStatus *int
	// LastError is the last failure as recorded (the caller redacts URLs it shows).
	LastError  string
	CreatedAt  time.Time
	FinishedAt *time.Time
}

// DeliveryFilter narrows Deliveries. Zero fields do not filter.
type DeliveryFilter struct {
	Endpoint string
	// State is pending, delivered or dead.
	State       string
	Pipeline    string
	CausationID string
	OperationID uuid.UUID
	// AfterID continues a list after the delivery with this id (newest first).
	AfterID int64
	// Limit bounds the page. Defaults to 50.
	Limit int
}

// Deliveries returns deliveries, newest first.
func (s *Store) Deliveries(ctx context.Context, pool *pgxpool.Pool, f DeliveryFilter) ([]*Delivery, error) {
	var w sqlwhere.Where
	if f.Endpoint != "" {
		w.Add("endpoint = ?", f.Endpoint)
	}
	if f.State != "" {
		w.Add("state = ?", f.State)
	}
	if f.Pipeline != "" {
		w.Add("pipeline = ?", f.Pipeline)
	}
	if f.CausationID != "" {
		w.Add("causation_id = ?", f.CausationID)
	}
	if f.OperationID != uuid.Nil {
		w.Add("operation_id = ?", f.OperationID)
	}
	if f.AfterID > 0 {
		w.Add("id < ?", f.AfterID)
	}
	limit := w.Arg(cmp.Or(f.Limit, 50))
	rows, err := pool.Query(ctx, `SELECT id, endpoint, operation_id, pipeline, causation_id, state, attempts,
       next_attempt_at, last_status, coalesce(last_error, ''), created_at, finished_at
FROM `+s.deliveries+w.SQL()+` ORDER BY id DESC LIMIT `+limit, w.Args()...)
	if err != nil {
		return nil, fmt.Errorf("error listing deliveries: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (*Delivery, error) {
		var d Delivery
		err := row.Scan(&d.ID, &d.Endpoint, &d.OperationID, &d.Pipeline, &d.CausationID, &d.State, &d.Attempts,
			&d.NextAttemptAt, &d.LastStatus, &d.LastError, &d.CreatedAt, &d.FinishedAt)
		return &d, err
	})
}

// EndpointState is an endpoint as registered by the deliverers, with its counts.
type EndpointState struct {
	Name string
	// URL is as configured (the caller redacts it).
	URL            string
	DisabledAt     *time.Time
	DisabledReason string
	Pending        int64
	Dead           int64
	Delivered      int64
	// OldestPendingAt is the creation time of the oldest pending delivery.
	OldestPendingAt *time.Time
}

// Endpoints returns every registered endpoint, by name.
func (s *Store) Endpoints(ctx context.Context, pool *pgxpool.Pool) ([]*EndpointState, error) {
	rows, err := pool.Query(ctx, `SELECT e.name, e.url, e.disabled_at, coalesce(e.disabled_reason, ''),
       count(d.*) FILTER (WHERE d.state = 'pending'), count(d.*) FILTER (WHERE d.state = 'dead'),
       count(d.*) FILTER (WHERE d.state = 'delivered'), min(d.created_at) FILTER (WHERE d.state = 'pending')
FROM `+s.endpoints+` e LEFT JOIN `+s.deliveries+` d ON d.endpoint = e.name
GROUP BY e.name ORDER BY e.name`)
	if err != nil {
		return nil, fmt.Errorf("error listing endpoints: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (*EndpointState, error) {
		var e EndpointState
		err := row.Scan(&e.Name, &e.URL, &e.DisabledAt, &e.DisabledReason, &e.Pending, &e.Dead, &e.Delivered, &e.OldestPendingAt)
		return &e, err
	})
}

// Disable stops deliveries to an endpoint: its events stay queued, in order, until Enable.
// Running deliverers notice at once (NOTIFY) or within their poll interval; a request
// already in flight finishes. It fails with ErrNotFound for an endpoint no deliverer
// registered.
func (s *Store) Disable(ctx context.Context, pool *pgxpool.Pool, name, reason string) error {
	tag, err := pool.Exec(ctx, `UPDATE `+s.endpoints+` SET disabled_at = now(), disabled_reason = $2, updated_at = now()
WHERE name = $1`, name, reason)
	if err != nil {
		return fmt.Errorf("error disabling endpoint %q: %w", name, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("endpoint %q: %w", name, ErrNotFound)
	}
	s.notify(ctx, pool)
	return nil
}

package deadletter

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/sqlwhere"
)

// Operators' reads of dead letters (the admin API, `idemd dlq list`): filtered, paged by id.

// Origins of a dead letter: which part of idemd wrote it, hence how it is replayed.
const (
	// OriginSource: a webhook or API request of an HTTP source (replayed through it).
	OriginSource = "source"
	// OriginSubscription: a Kafka record of a subscription (replayed through it).
	OriginSubscription = "subscription"
	// OriginRelay: an outbox event the broker refused (replayed by enqueueing it again).
	OriginRelay = "relay"
	// OriginDelivery: an outbound HTTP delivery that failed (replayed by requeueing it).
	OriginDelivery = "delivery"
)

// Origins lists the origins, for validation and help texts.
var Origins = []string{OriginSource, OriginSubscription, OriginRelay, OriginDelivery}

// originSQL computes a letter's origin from what the writers record (metadata "door", the
// scope prefixes of the outbound paths).
const originSQL = `CASE
    WHEN metadata->>'door' = 'http_delivery' OR scope LIKE 'http:%' THEN 'delivery'
    WHEN metadata->>'door' = 'relay' OR scope LIKE 'kafka:%' THEN 'relay'
    WHEN metadata->>'door' = 'http' THEN 'source'
    ELSE 'subscription' END`

// Query narrows Find and Count. Zero fields do not filter.
type Query struct {
	Pipeline string
	// Origin is one of Origins.
	Origin string
	// Reason keeps letters whose reason contains it (case-insensitive).
	Reason    string
	MessageID string
	// Since and Until bound created_at: Since <= created_at < Until.
	Since, Until time.Time
	// Replayed, when set, keeps letters replayed (true) or not yet replayed (false).
	Replayed *bool
	// AfterID continues a list after the letter with this id, in the list's order.
	AfterID int64
	// Limit bounds Find's page. Defaults to 50.
	Limit int
	// Ascending lists oldest first; the default is newest first.
	Ascending bool
}

func (q *Query) where() *sqlwhere.Where {
	w := &sqlwhere.Where{}
	if q.Pipeline != "" {
		w.Add("pipeline = ?", q.Pipeline)
	}
	if q.Origin != "" {
		w.Add("("+originSQL+") = ?", q.Origin)
	}
	if q.Reason != "" {
		w.Add("reason ILIKE ?", "%"+sqlwhere.Like(q.Reason)+"%")
	}
	if q.MessageID != "" {
		w.Add("message_id = ?", q.MessageID)
	}
	if !q.Since.IsZero() {
		w.Add("created_at >= ?", q.Since)
	}
	if !q.Until.IsZero() {
		w.Add("created_at < ?", q.Until)
	}
	if q.Replayed != nil {
		if *q.Replayed {
			w.Add("replayed_at IS NOT NULL")
		} else {
			w.Add("replayed_at IS NULL")
		}
	}
	return w
}

// Found is a letter as an operator sees it: with its origin.
type Found struct {
	*Letter
	Origin string
}

// Find returns the letters q selects, newest first unless q.Ascending.
func (s *Store) Find(ctx context.Context, pool *pgxpool.Pool, q Query) ([]*Found, error) {
	w := q.where()
	order := "DESC"
	if q.Ascending {
		order = "ASC"
	}
	if q.AfterID > 0 {
		if q.Ascending {
			w.Add("id > ?", q.AfterID)
		} else {
			w.Add("id < ?", q.AfterID)
		}
	}
	limit := w.Arg(cmp.Or(q.Limit, 50))
	rows, err := pool.Query(ctx, `SELECT `+columns+`, `+originSQL+` FROM `+s.table+w.SQL()+
		` ORDER BY id `+order+` LIMIT `+limit, w.Args()...)
	if err != nil {
		return nil, fmt.Errorf("error listing dead letters: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (*Found, error) {
		var l Letter
		f := &Found{Letter: &l}
		err := row.Scan(&l.ID, &l.Pipeline, &l.Scope, &l.MessageID, &l.Payload, &l.Headers, &l.Metadata,
			&l.Reason, &l.Attempts, &l.CreatedAt, &l.ReplayedAt, &f.Origin)
		return f, err
	})
}

// Get returns one letter with its origin, or ErrNotFound.
func (s *Store) Get(ctx context.Context, pool *pgxpool.Pool, id int64) (*Found, error) {
	found, err := s.Find(ctx, pool, Query{AfterID: id + 1, Limit: 1})
	if err != nil {
		return nil, err
	}
	if len(found) == 0 || found[0].ID != id {
		return nil, fmt.Errorf("dead letter %d: %w", id, ErrNotFound)
	}
	return found[0], nil
}

// Count returns how many letters q selects (q.AfterID and q.Limit aside).
func (s *Store) Count(ctx context.Context, pool *pgxpool.Pool, q Query) (int64, error) {
	w := q.where()
	var n int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+s.table+w.SQL(), w.Args()...).Scan(&n); err != nil {
		return 0, fmt.Errorf("error counting dead letters: %w", err)
	}
	return n, nil
}

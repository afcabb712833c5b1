package deadletter

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/sqlwhere"
)

// Operators' reads of dead letters (the admin API, `idemd dlq list`): filtered, paged by id.

// Doors lists the doors, in the order operators see them (filters, help texts).
var Doors = []Door{DoorHTTP, DoorKafka, DoorPubSub, DoorSQS, DoorRelay, DoorDelivery}

// Query narrows Find and Count. Zero fields do not filter.
type Query struct {
	Pipeline string
	// Door keeps the letters one door wrote.
	Door Door
	// Reason keeps letters whose reason contains it (case-insensitive).
	Reason    string
	MessageID string
	// MessageIDs keeps the letters of any of these message ids (with MessageID, of any of
	// them or it).
	MessageIDs []string
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
	if q.Door != "" {
		w.Add("door = ?", string(q.Door))
	}
	if q.Reason != "" {
		w.Add("reason ILIKE ?", "%"+sqlwhere.Like(q.Reason)+"%")
	}
	switch {
	case len(q.MessageIDs) > 0 && q.MessageID != "":
		w.Add("message_id = ANY(?)", append([]string{q.MessageID}, q.MessageIDs...))
	case len(q.MessageIDs) > 0:
		w.Add("message_id = ANY(?)", q.MessageIDs)
	case q.MessageID != "":
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

// Find returns the letters q selects, newest first unless q.Ascending.
func (s *Store) Find(ctx context.Context, pool *pgxpool.Pool, q Query) ([]*Letter, error) {
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
	rows, err := pool.Query(ctx, `SELECT `+columns+` FROM `+s.table+w.SQL()+` ORDER BY id `+order+` LIMIT `+limit, w.Args()...)
	if err != nil {
		return nil, fmt.Errorf("error listing dead letters: %w", err)
	}
	return pgx.CollectRows(rows, scan)
}

// Get returns one letter, or ErrNotFound.
func (s *Store) Get(ctx context.Context, pool *pgxpool.Pool, id int64) (*Letter, error) {
	rows, err := pool.Query(ctx, `SELECT `+columns+` FROM `+s.table+` WHERE id = $1`, id)
	if err != nil {
		return nil, fmt.Errorf("error loading dead letter %d: %w", id, err)
	}
	l, err := pgx.CollectExactlyOneRow(rows, scan)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("dead letter %d: %w", id, ErrNotFound)
	}
	return l, err
}

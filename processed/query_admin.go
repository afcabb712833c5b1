package processed

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/sqlwhere"
)

// Operators' reads of the records and conflicts (the admin API, `idemd inspect`): filtered
// lists, newest first, paged by keyset.

// ErrNotFound: no record has that scope and id.
var ErrNotFound = errors.New("processed record not found")

// ListLimitDefault is the page size of the list functions when none is given.
const ListLimitDefault = 50

// ScopeTenant splits a claim scope into its pipeline and tenant (Scope's inverse).
func ScopeTenant(scope string) (pipeline, tenant string) {
	pipeline, tenant, _ = strings.Cut(scope, "\x1f")
	return pipeline, tenant
}

// RecordCursor is where a page of records ends; the next page starts after it.
type RecordCursor struct {
	ReceivedAt time.Time
	Scope      string
	MessageID  string
}

// RecordFilter narrows ListRecords. Zero fields do not filter.
type RecordFilter struct {
	// Pipeline keeps the records of one pipeline (all its tenants).
	Pipeline string
	// Tenant keeps one tenant's records (API sources).
	Tenant string
	// MessageID keeps the records of one message id or idempotency key.
	MessageID string
	// State keeps the records in one state.
	State State
	// Stale, when set, keeps the records whose effect the stale-event guard skipped
	// (Record.Stale; true) or the others (false). Defaults to nil: both.
	Stale *bool
	// Since and Until bound received_at: Since <= received_at < Until.
	Since, Until time.Time
	// After continues a list after the last record of the previous page.
	After *RecordCursor
	// Limit bounds the page. Defaults to ListLimitDefault.
	Limit int
	// BodyClaims lists the signed-body claims (BodyScope) too; they are not messages, and
	// are left out without it. Defaults to false.
	BodyClaims bool
}

// scopeFilter adds the pipeline and tenant conditions on column scope.
func scopeFilter(w *sqlwhere.Where, pipeline, tenant string) {
	switch {
	case pipeline != "" && tenant != "":
		w.Add("scope = ?", Scope(pipeline, tenant))
	case pipeline != "":
		w.Add("(scope = ? OR scope LIKE ?)", pipeline, sqlwhere.Like(pipeline+"\x1f")+"%")
	case tenant != "":
		w.Add("scope LIKE ?", "%"+sqlwhere.Like("\x1f"+tenant))
	}
}

const recordColumns = `scope, message_id, fingerprint, status, response_status, response_headers, response_body,
       received_at, completed_at, expires_at, lease_until`

// listedColumns are the columns of the operators' reads: recordColumns, then the stale
// mark (Record.Stale), which a claim's lookup does not read.
const listedColumns = recordColumns + `, stale_entity, stale_version::text`

// isStale is the condition of the records whose effect the stale-event guard skipped.
const isStale = `stale_version IS NOT NULL`

// listedScanner reads listedColumns rows into new Records.
type listedScanner struct {
	sc              *recordScanner
	entity, version *string
}

func newListedScanner() *listedScanner {
	s := &listedScanner{}
	s.sc = newRecordScanner(&s.entity, &s.version)
	return s
}

func (s *listedScanner) scan(rows pgx.Rows) (*Record, error) {
	s.entity, s.version = nil, nil
	r, err := s.sc.scan(rows)
	if err != nil {
		return nil, err
	}
	if s.version != nil {
		r.Stale = &Stale{Version: *s.version}
		if s.entity != nil {
			r.Stale.Entity = *s.entity
		}
	}
	return r, nil
}

// ListRecords returns processed records, newest first.
func (s *Store) ListRecords(ctx context.Context, pool *pgxpool.Pool, f RecordFilter) ([]*Record, error) {
	sql, args := s.listRecordsSQL(f)
	rows, err := pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("error listing processed records: %w", err)
	}
	defer rows.Close()
	var out []*Record
	sc := newListedScanner()
	for rows.Next() {
		r, err := sc.scan(rows)
		if err != nil {
			return nil, fmt.Errorf("error listing processed records: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// listRecordsSQL is ListRecords' statement and its arguments.
func (s *Store) listRecordsSQL(f RecordFilter) (string, []any) {
	var w sqlwhere.Where
	t := pgx.Identifier{s.schema}.Sanitize() + ".processed_messages"
	from := t
	if f.MessageID != "" {
		id := w.Arg(f.MessageID)
		w.Add("message_id = " + id)
		if f.Pipeline == "" || f.Tenant == "" {
			// Not one scope: walk them. With both, the scope filter and the id make the
			// primary key.
			from = byMessageID(t, id)
		}
	}
	scopeFilter(&w, f.Pipeline, f.Tenant)
	if f.State != "" {
		w.Add("status = ?", string(f.State))
	}
	if f.Stale != nil {
		cond := isStale
		if !*f.Stale {
			cond = "NOT (" + isStale + ")"
		}
		w.Add(cond)
	}
	if !f.Since.IsZero() {
		w.Add("received_at >= ?", f.Since)
	}
	if !f.Until.IsZero() {
		w.Add("received_at < ?", f.Until)
	}
	if c := f.After; c != nil {
		w.Add("(received_at, scope, message_id) < (?, ?, ?)", c.ReceivedAt, c.Scope, c.MessageID)
	}
	if !f.BodyClaims { // IsBodyClaim's test
		w.Add("NOT (scope LIKE ? AND message_id = 'sha256:' || encode(fingerprint, 'hex'))", "%"+sqlwhere.Like("\x1f"+BodyTenant))
	}
	limit := w.Arg(cmp.Or(f.Limit, ListLimitDefault))
	return `SELECT ` + listedColumns + ` FROM ` + from + w.SQL() +
		` ORDER BY received_at DESC, scope DESC, message_id DESC LIMIT ` + limit, w.Args()
}

// byMessageID is the FROM of a search for the records of one message id (parameter id) in
// every scope, in table t: no index has message_id first (migration 0007 dropped it, one
// random write less per message), so the distinct scopes are walked on the primary key,
// one probe each (a loose index scan), and each scope's record is read by its key (LIMIT 1,
// a key's one row, keeps the planner from turning the probes into a walk of the whole key).
func byMessageID(t, id string) string {
	return `(WITH RECURSIVE scopes (scope) AS (
    SELECT min(scope) FROM ` + t + `
    UNION ALL
    SELECT (SELECT min(p.scope) FROM ` + t + ` p WHERE p.scope > s.scope) FROM scopes s WHERE s.scope IS NOT NULL)
SELECT p.* FROM scopes s CROSS JOIN LATERAL (
    SELECT * FROM ` + t + ` p WHERE p.scope = s.scope AND p.message_id = ` + id + ` LIMIT 1) p) AS processed_messages`
}

// GetRecord returns the record of (scope, id), or ErrNotFound.
func (s *Store) GetRecord(ctx context.Context, pool *pgxpool.Pool, scope, id string) (*Record, error) {
	rows, err := pool.Query(ctx, `SELECT `+listedColumns+` FROM `+pgx.Identifier{s.schema}.Sanitize()+
		`.processed_messages WHERE scope = $1 AND message_id = $2`, scope, id)
	if err != nil {
		return nil, fmt.Errorf("error reading processed record: %w", err)
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("error reading processed record: %w", err)
		}
		return nil, ErrNotFound
	}
	return newListedScanner().scan(rows)
}

// ConflictRecord is one recorded conflict: a message id seen again with another payload.
type ConflictRecord struct {
	Scope               string
	MessageID           string
	StoredFingerprint   []byte
	IncomingFingerprint []byte
	// Count is how many times this incoming fingerprint was seen.
	Count       int64
	FirstSeenAt time.Time
	LastSeenAt  time.Time
	// ExpiresAt is when the pruner may delete it (nil for conflicts recorded before idemd
	// kept payloads: the store's retention after LastSeenAt).
	ExpiresAt *time.Time
	// Payload is the conflicting payload's first MaxConflictPayload bytes (nil for
	// conflicts recorded before idemd kept payloads).
	Payload          []byte
	PayloadTruncated bool
}

// ConflictCursor is where a page of conflicts ends.
type ConflictCursor struct {
	FirstSeenAt         time.Time
	Scope               string
	MessageID           string
	IncomingFingerprint []byte
}

// ConflictFilter narrows ListConflicts. Zero fields do not filter.
type ConflictFilter struct {
	Pipeline  string
	Tenant    string
	MessageID string
	// Since keeps conflicts last seen at or after it.
	Since time.Time
	After *ConflictCursor
	// Limit bounds the page. Defaults to ListLimitDefault.
	Limit int
}

// ListConflicts returns recorded conflicts, newest first (by first sighting).
func (s *Store) ListConflicts(ctx context.Context, pool *pgxpool.Pool, f ConflictFilter) ([]*ConflictRecord, error) {
	var w sqlwhere.Where
	scopeFilter(&w, f.Pipeline, f.Tenant)
	if f.MessageID != "" {
		w.Add("message_id = ?", f.MessageID)
	}
	if !f.Since.IsZero() {
		w.Add("last_seen_at >= ?", f.Since)
	}
	if c := f.After; c != nil {
		w.Add("(first_seen_at, scope, message_id, incoming_fingerprint) < (?, ?, ?, ?)",
			c.FirstSeenAt, c.Scope, c.MessageID, c.IncomingFingerprint)
	}
	limit := w.Arg(cmp.Or(f.Limit, ListLimitDefault))
	rows, err := pool.Query(ctx, `SELECT scope, message_id, stored_fingerprint, incoming_fingerprint, count,
       first_seen_at, last_seen_at, expires_at, payload, payload_truncated
FROM `+pgx.Identifier{s.schema}.Sanitize()+`.conflicts`+w.SQL()+`
ORDER BY first_seen_at DESC, scope DESC, message_id DESC, incoming_fingerprint DESC LIMIT `+limit, w.Args()...)
	if err != nil {
		return nil, fmt.Errorf("error listing conflicts: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (*ConflictRecord, error) {
		var c ConflictRecord
		err := row.Scan(&c.Scope, &c.MessageID, &c.StoredFingerprint, &c.IncomingFingerprint, &c.Count,
			&c.FirstSeenAt, &c.LastSeenAt, &c.ExpiresAt, &c.Payload, &c.PayloadTruncated)
		return &c, err
	})
}

// LastBatch is the most recent transaction that committed records of one scope: the
// records of a batch share their received_at (the transaction's start).
type LastBatch struct {
	CommittedAt time.Time
	Messages    int64
	// LastMessageID is the largest message id of the batch.
	LastMessageID string
}

// LastBatchOf returns the last batch of records claimed in scope, or nil when there is none.
func (s *Store) LastBatchOf(ctx context.Context, pool *pgxpool.Pool, scope string) (*LastBatch, error) {
	t := pgx.Identifier{s.schema}.Sanitize() + ".processed_messages"
	var b LastBatch
	var at *time.Time
	err := pool.QueryRow(ctx, `WITH last AS (SELECT max(received_at) AS at FROM `+t+` WHERE scope = $1)
SELECT last.at, count(p.*), coalesce(max(p.message_id), '') FROM last LEFT JOIN `+t+` p
    ON p.scope = $1 AND p.received_at = last.at GROUP BY last.at`, scope).Scan(&at, &b.Messages, &b.LastMessageID)
	if err != nil {
		return nil, fmt.Errorf("error reading the last batch of %q: %w", scope, err)
	}
	if at == nil {
		return nil, nil
	}
	b.CommittedAt = *at
	return &b, nil
}

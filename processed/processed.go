// Package processed records which messages have been applied, inside the caller's
// transaction. Guarantee: for one (scope, message id), at most one transaction ever commits a
// claim as new; every other claimer, concurrent or later, sees that record (duplicate,
// conflict or in flight) once the first has committed, and a claim that rolls back leaves
// nothing behind. Atomicity comes from the table's primary key, never from a
// check-then-insert. The table is partitioned by epoch (epochs.go): claims of one id at the
// same time always insert into the same epoch, under a lock that opening an epoch takes
// exclusively, and a claim sees the ids of every older epoch. The caller's transaction must
// be READ COMMITTED (PostgreSQL's default); a claim in another fails.
//
// Claiming and the effect belong in one transaction:
//
//	tx, _ := pool.Begin(ctx)
//	defer tx.Rollback(ctx)
//	rec, err := processed.ClaimTx(ctx, tx, "orders", id, processed.Fingerprint(body))
//	switch {
//	case errors.Is(err, processed.ErrDuplicate): // already applied: answer rec.Response
//	case errors.Is(err, processed.ErrConflict): // refuse it; already recorded, even if tx rolls back
//	case err != nil: // in flight, or a database error: retry later
//	default: // new: run the effect in tx (CompleteTx stores an answer to replay), then commit
//	}
//
// The fingerprint is required: it tells a duplicate (same payload) from a conflict.
package processed

import (
	"cmp"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/internal/fingerprint"
	"github.com/idemd/idemd/migrations"
)

// Defaults of Config.
const (
	RetentionDefault = 7 * 24 * time.Hour
	LeaseDefault     = 30 * time.Second
)

// Sentinel errors of ClaimTx; the returned *Record says more.
var (
	// ErrDuplicate: the id was applied before with the same fingerprint. Record.Response
	// holds what was stored for it.
	ErrDuplicate = errors.New("message already processed")
	// ErrConflict: the id was applied (or is in flight) with a different fingerprint. The
	// conflict has been recorded for investigation, in a transaction of its own: rolling
	// back the caller's does not lose it (ClaimTx).
	ErrConflict = errors.New("message id reused with a different payload")
	// ErrInFlight: another transaction holds a live claim on the id.
	ErrInFlight = errors.New("message is being processed")
	// ErrLeaseLost: a reservation's lease was taken over by another claimer.
	ErrLeaseLost = errors.New("reservation lease lost to another claimer")
)

// Config configures a Store.
type Config struct {
	// Schema holds idemd's tables. Defaults to "idemd".
	Schema string
	// Retention is how long a record is kept when a claim gives none; after it the id
	// counts as new. Defaults to 7 days (RetentionDefault).
	Retention time.Duration
	// Lease is how long a reservation (Claim.Reserve) is protected before another claimer
	// may take it over. Defaults to 30 s (LeaseDefault).
	Lease time.Duration
	// Filter, when set, spares the claims the lookup of their new ids in the older epochs
	// (EpochFilter; its Run keeps it current). It must be of Schema. Optional: without it,
	// every new id is looked up.
	Filter *EpochFilter
}

// Store runs the processed-messages queries against one schema.
type Store struct {
	schema    string
	retention time.Duration
	lease     time.Duration
	sql       queries
	// epochKey is the epochs' advisory lock (epochs.go).
	epochKey int64
	// filter is Config.Filter, nil without one.
	filter *EpochFilter
}

// New returns a Store for cfg; cfg may be nil.
func New(cfg *Config) (*Store, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	s := &Store{
		schema:    cmp.Or(cfg.Schema, migrations.SchemaDefault),
		retention: cmp.Or(cfg.Retention, RetentionDefault),
		lease:     cmp.Or(cfg.Lease, LeaseDefault),
	}
	if s.retention < 0 {
		return nil, fmt.Errorf("processed: Retention must not be negative, got %s", cfg.Retention)
	}
	if s.lease < 0 {
		return nil, fmt.Errorf("processed: Lease must not be negative, got %s", cfg.Lease)
	}
	if f := cfg.Filter; f != nil && f.schema != s.schema {
		return nil, fmt.Errorf("%w: Schema is %q, the filter's %q", errFilterSchema, s.schema, f.schema)
	}
	s.filter = cfg.Filter
	s.sql = newQueries(pgx.Identifier{s.schema}.Sanitize())
	s.epochKey = epochLockKey(s.schema)
	return s, nil
}

// Schema returns the schema the store works in.
func (s *Store) Schema() string { return s.schema }

// Default is the Store on the default schema, behind the package-level functions.
var Default = func() *Store {
	s, err := New(nil)
	if err != nil {
		panic(err)
	}
	return s
}()

// State is the stored state of a record.
type State string

const (
	// StateInFlight: claimed, effect not committed yet (visible to others only for
	// reservations, which commit before their effect).
	StateInFlight State = "in_flight"
	// StateDone: the effect committed.
	StateDone State = "done"
	// StateDead: the effect failed permanently and the message was dead-lettered.
	StateDead State = "dead"
)

// Response is what was answered for a message, stored so that a retry gets it back.
type Response struct {
	Status  int
	Headers map[string]string
	Body    []byte
}

// Record is a stored processed_messages row.
type Record struct {
	Scope       string
	MessageID   string
	Fingerprint []byte
	State       State
	Response    *Response
	ReceivedAt  time.Time
	CompletedAt *time.Time
	ExpiresAt   time.Time
	LeaseUntil  *time.Time
	// Stale, on a done record, says that the stale-event guard skipped its message's effect
	// (QueueStale); nil when the effect was applied. The operators' reads (ListRecords,
	// GetRecord) fill it in; a claim's record (a duplicate's) leaves it nil.
	Stale *Stale
}

// Stale is what the stale-event guard found for a message it skipped: its entity, and its
// version, which was not newer than the entity's last applied one.
type Stale struct {
	Entity string
	// Version is the version as the guard compared it: a decimal number (an RFC 3339 time
	// is in microseconds since the Unix epoch).
	Version string
}

// Scope joins a pipeline name and a tenant into a claim scope. Ids of different scopes never
// meet: one tenant can never see another's record.
func Scope(pipeline, tenant string) string {
	if tenant == "" {
		return pipeline
	}
	return pipeline + "\x1f" + tenant
}

// BodyTenant is the tenant part of the scope of signed-body claims (BodyScope).
const BodyTenant = "body"

// BodyScope is the scope in which a webhook source whose message id is not signed (GitHub,
// Shopify, hmac-sha256 with the id in a header) also claims its signed body, as
// "sha256:<hex>" with the digest as fingerprint: a body resent under a fresh id is then a
// duplicate. Such a claim is not a message (IsBodyClaim).
func BodyScope(scope string) string { return scope + "\x1f" + BodyTenant }

// IsBodyClaim says whether a record is a signed-body claim (BodyScope) rather than a
// message: its tenant is BodyTenant and its id is its fingerprint's, which no API key's is.
func IsBodyClaim(scope, id string, fingerprint []byte) bool {
	_, tenant := ScopeTenant(scope)
	return tenant == BodyTenant && id == "sha256:"+hex.EncodeToString(fingerprint)
}

// MaxIDLength is the longest message id (or idempotency key) idemd claims, in bytes.
const MaxIDLength = 255

// ValidID reports whether id can be claimed: 1 to MaxIDLength bytes of UTF-8 text without
// control characters (C0, DEL and C1: U+0080 to U+009F, which terminals read as escapes),
// and not blank: an id of spaces alone is what a sender with no id sends, and every such
// message would fall on one id.
// The doors check it before claiming: the HTTP receiver answers 400, the Kafka consumer
// dead-letters the record; an id that PostgreSQL could not store or index never reaches a
// claim, where it would fail a whole batch.
func ValidID(id string) bool {
	if len(id) == 0 || len(id) > MaxIDLength || !utf8.ValidString(id) {
		return false
	}
	for _, r := range id {
		if r < 0x20 || (r >= 0x7f && r <= 0x9f) {
			return false
		}
	}
	return strings.TrimSpace(id) != ""
}

// Fingerprint is the fingerprint idemd's doors compare for a message body: SHA-256 of its
// canonical JSON (object keys sorted, no insignificant whitespace, numbers as written), minus
// the fields named by ignore (JSON pointers such as "/pending_webhooks", which a provider
// changes between retries); the raw bytes when the body is not JSON. Two deliveries of the
// same document fingerprint alike whatever their key order or spacing.
func Fingerprint(body []byte, ignore ...string) []byte {
	return fingerprint.Body(body, ignore...)
}

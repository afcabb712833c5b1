package exactlyonce

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/outbox"
	"github.com/idemd/idemd/processed"
)

// Message is one unit of input: plain data that a door builds from what it received (a
// webhook, an API request, a broker record). The unit claims it, runs its effect, writes
// its events or its dead letter, stores its answer, and fills in Result.
type Message struct {
	// Scope and ID are the dedup key: a message is applied at most once per (Scope, ID).
	Scope string
	ID    string
	// Fingerprint tells a retry (same fingerprint) from a reuse of the id for another
	// payload (a conflict).
	Fingerprint []byte
	// Retention of the processed record; zero means the store's default.
	Retention time.Duration
	// Payload is the message's body, kept with a conflict for investigation
	// (processed.Claim.Payload). Defaults to none.
	Payload []byte
	// Also lists more keys claimed with the message, in the same transaction. The message
	// is applied only when its own key and every one of these are new; when one of them is
	// known the message is a Duplicate. A webhook whose id is not covered by its signature
	// claims its signed body's hash here, so that the same signed bytes sent again under
	// another id never run the effect twice.
	Also []Key
	// Invalid, when set, says why the message cannot be applied at all (no usable id, a
	// missing order field): it is dead-lettered at once, without running its effect.
	Invalid error
	// Guard, when set, skips the effect of a message older than the last one applied for
	// the same entity (Outcome Stale).
	Guard *Guard
	// Effect runs when the id is new. The zero Effect means the claim is the whole effect.
	Effect Effect
	// Events are written to the outbox, in the same transaction, when the effect ran.
	Events []Event
	// MaxAttempts is how many times a permanently failing effect is tried before the
	// message is dead-lettered: failures of this message's effect, not runs of it (a batch
	// retried for another message's transient failure runs every effect again, rolled
	// back). Defaults to 1.
	MaxAttempts int
	// Letter is written when the message is dead-lettered; the unit fills in its Reason
	// and Attempts. Nil: the record is marked dead and nothing else is kept.
	Letter *deadletter.Letter
	// LetterEvents are written to the outbox with the letter (a dead-letter topic
	// record); the unit sets their deadletter.HeaderReason header to the cause.
	LetterEvents []outbox.Event
	// Letterer, when set, makes Letter and LetterEvents when the message is dead-lettered,
	// so that a door builds them only for the few messages that need them. The unit calls
	// it once, before it reads them.
	Letterer Letterer
	// Answer, when set, makes the unit build the message's answer from its effect's
	// result and store it in the processed record, so that a retry is answered the same,
	// byte for byte (API requests).
	Answer *Answer
	// Trace is the message's trace context: its door's span (the HTTP request, the
	// consumed record), or the one it arrived with. The unit's spans continue it, and its
	// events and letter events carry it on (their traceparent header). Defaults to none.
	Trace trace.SpanContext

	// Result is filled in by the unit.
	Result
}

// Letterer makes a message's dead letter and dead-letter events (Message.Letterer).
type Letterer interface {
	DeadLetter(m *Message) (*deadletter.Letter, []outbox.Event)
}

// Key is one more (scope, id) claimed with a message (Message.Also).
type Key struct {
	Scope       string
	ID          string
	Fingerprint []byte
}

// Effect is a message's bound effect: SQL with its arguments, a Go function, or both (SQL
// first). Errors of the database's classes 22, 23 and 42, and errors marked Permanent, are
// permanent; any other error is transient and retried.
type Effect struct {
	// SQL is the statement, with positional parameters ($1…). Defaults to none.
	SQL string
	// Args are SQL's arguments.
	Args []any
	// Many, when set, is SQL for many messages at once: its $n is an array of the $n of
	// each message's Args. The unit runs the effects of consecutive messages with the same
	// Many as one statement when their results are not needed (one statement per batch
	// instead of one per message). It must do exactly what SQL does run once per message,
	// in that order; effectsql.Statement.Many is such a rewriting. Defaults to none.
	Many string
	// Func runs in the transaction (after SQL). What it returns is the effect's result:
	// nil, JSON bytes (json.RawMessage or []byte), or a value encoded to JSON. It must not
	// commit or roll back tx. Defaults to none.
	Func func(ctx context.Context, tx pgx.Tx) (any, error)
}

// IsZero reports whether e does nothing.
func (e *Effect) IsZero() bool { return e.SQL == "" && e.Func == nil }

// Event is an outbox event of a message.
type Event struct {
	outbox.Event
	// FromResult replaces Payload with the effect's result as JSON ("null" when there is
	// none): the rows an API's SQL returned, published downstream.
	FromResult bool
}

// Guard is the stale-event guard of one message: its version of its entity must be newer
// than the last one applied in Scope, or its effect is skipped.
type Guard struct {
	// Scope groups entities (the pipeline).
	Scope string
	// Entity identifies the entity.
	Entity string
	// Version is a decimal number; larger is newer.
	Version string
}

// Answer says how a message's answer is built and stored (API requests). The answer of an
// effect that committed is, in this order: the business answer it gave (a BusinessError, or
// a StatusColumn in its first row; answer.go), NoRows when set and its SQL affected no rows,
// or Status with the effect's result as JSON (Empty when there is none).
type Answer struct {
	// Status is the status of a new message whose effect committed. 204 answers without a
	// body.
	Status int
	// Empty is the body when the effect returns nothing.
	Empty []byte
	// NoRows, when set, is the answer when the effect's SQL affected no rows (a delete of
	// an id that does not exist). Defaults to nil: Status.
	NoRows *processed.Response
	// Failed builds the answer stored for a message whose effect failed permanently.
	// Defaults to nil: nothing is stored.
	Failed func(cause error) *processed.Response
}

// Outcome is what happened to one message.
type Outcome int

const (
	// Pending: not decided yet (only seen inside the unit).
	Pending Outcome = iota
	// Applied: new; its effect committed.
	Applied
	// Duplicate: applied before with the same fingerprint; Response holds the stored one.
	Duplicate
	// Conflict: the id is known with a different fingerprint; recorded, effect not run.
	Conflict
	// InFlight: a reservation holds the id (only returned by Reserve).
	InFlight
	// DeadLettered: the effect failed permanently MaxAttempts times, or the message was
	// Invalid; its Letter was written.
	DeadLettered
	// Stale: new, but older than the last message applied for its entity (Guard); its
	// effect and events were skipped, and its record, done, says so
	// (processed.Record.Stale).
	Stale
)

func (o Outcome) String() string {
	return [...]string{"pending", "applied", "duplicate", "conflict", "in_flight", "dead_lettered", "stale"}[o]
}

// Result is what the unit did with a message.
type Result struct {
	Outcome Outcome
	// Response is the answer built for the message (Applied, DeadLettered, with Answer
	// set) or the stored one (Duplicate).
	Response *processed.Response
	// Record is the stored record for Duplicate, Conflict and InFlight.
	Record *processed.Record
	// ConflictCount is how many times this conflicting payload was seen.
	ConflictCount int64
	// Attempts is how many times the effect ran in the committed transaction.
	Attempts int
	// Cause is the last permanent error of a dead-lettered message.
	Cause error
}

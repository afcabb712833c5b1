// Package exactlyonce is the unit of work both doors of idemd call: in one PostgreSQL
// transaction it claims a batch of message ids, runs the effect of each new one, writes what
// the effect enqueues (outbox rows) or a dead letter, and records the result. Guarantee: a
// message's effect commits together with its processed row or not at all, so it is applied
// at most once per (scope, id); Apply returns only after the commit, so a door that
// acknowledges after Apply acknowledges only what is durable.
//
// Failures are handled here, once:
//   - transient (connection loss, serialization failure, deadlock…): the whole batch is
//     rolled back and retried with capped exponential backoff until it commits or ctx ends;
//     no message is ever skipped;
//   - permanent (bad data, constraint, an error wrapped with Permanent): the batch is run again
//     with a savepoint around each effect, so that one poison message never fails its
//     neighbours; the poison one is tried MaxAttempts times, then dead-lettered in the same
//     transaction that marks it processed.
package exactlyonce

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sirupsen/logrus"

	"github.com/idemd/idemd/internal/pgerr"
	"github.com/idemd/idemd/internal/retry"
	"github.com/idemd/idemd/processed"
)

// Outcome is what happened to one message.
type Outcome int

const (
	// Pending: not decided yet (only seen inside Apply).
	Pending Outcome = iota
	// Applied: new; its effect committed.
	Applied
	// Duplicate: applied before with the same fingerprint; Response holds the stored one.
	Duplicate
	// Conflict: the id is known with a different fingerprint; recorded, effect not run.
	Conflict
	// InFlight: a reservation holds the id.
	InFlight
	// DeadLettered: the effect failed permanently MaxAttempts times; DeadLetter ran.
	DeadLettered
)

func (o Outcome) String() string {
	return [...]string{"pending", "applied", "duplicate", "conflict", "in_flight", "dead_lettered"}[o]
}

// Effect runs a new message's effect in tx. The response it returns is stored when the
// message asks for it (Message.StoreResponse) and returned to later duplicates.
type Effect func(ctx context.Context, tx pgx.Tx, m *Message) (*processed.Response, error)

// DeadLetterFunc records a message whose effect failed permanently, in tx (a dead_letters
// row, a dead-letter topic record through the outbox, a stored error response…).
type DeadLetterFunc func(ctx context.Context, tx pgx.Tx, m *Message, cause error) (*processed.Response, error)

// Message is one unit of input. The door fills the first block; Apply fills the second.
type Message struct {
	Scope       string
	ID          string
	Fingerprint []byte
	// Retention of the processed record; zero means the store's default.
	Retention time.Duration
	// Payload is the message's body, kept with a conflict (processed.Claim.Payload).
	// Defaults to none.
	Payload []byte
	// Effect runs when the id is new. Nil means the claim is the whole effect.
	Effect Effect
	// MaxAttempts is how many times a permanently failing effect is tried before
	// DeadLetter. Defaults to 1.
	MaxAttempts int
	// DeadLetter runs after the last failed attempt. Nil means the failure is recorded
	// with state dead and no other trace.
	DeadLetter DeadLetterFunc
	// StoreResponse keeps the effect's response in the processed record.
	StoreResponse bool
	// Value is the door's own data for the effect (the parsed request, the Kafka record).
	Value any

	Outcome Outcome
	// Response is the effect's (Applied), the dead letter's (DeadLettered), or the stored
	// one (Duplicate).
	Response *processed.Response
	// Record is the stored record for Duplicate, Conflict and InFlight.
	Record *processed.Record
	// ConflictCount is how many times this conflicting payload was seen.
	ConflictCount int64
	// Attempts is how many times the effect ran in the committed transaction.
	Attempts int
	// Cause is the last permanent error of a dead-lettered message.
	Cause error
	// Careful is true while the effect runs in a savepoint of its own (the batch is being
	// run again after a permanent failure): the effect must then run its statements at
	// once rather than queue them for Config.Flush.
	Careful bool
}

type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

// Permanent marks err as permanent: the message it came from will fail the same way on
// every retry, so it is dead-lettered after MaxAttempts instead of retried forever.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

// IsPermanent reports whether err was marked Permanent or is a permanent database error.
func IsPermanent(err error) bool {
	var p permanentError
	return errors.As(err, &p) || pgerr.IsPermanent(err)
}

// Config configures a Unit.
type Config struct {
	// Processed is the store of claims. Defaults to processed.Default.
	Processed *processed.Store
	// BackoffMin is the first wait after a transient failure. Defaults to 50 ms.
	BackoffMin time.Duration
	// BackoffMax caps the wait between retries. Defaults to 5 s.
	BackoffMax time.Duration
	// Logger receives one line per retried failure. Defaults to logrus's standard logger.
	Logger *logrus.Entry
	// OnRetry, when set, is called after each transient failure (metrics).
	OnRetry func(err error)
	// BeforeCommit, when set, runs just before COMMIT; tests use it to crash at that
	// point.
	BeforeCommit func(msgs []*Message)
	// Flush, when set, runs in every try after the effects of the claimed messages and
	// before they are completed, in the same transaction: a door whose effects queue their
	// statements (a pgx.Batch) sends them here in one round trip. A permanent error makes
	// Apply run the batch again with a savepoint around each effect (Message.Careful).
	// Defaults to nil.
	Flush func(ctx context.Context, tx pgx.Tx, msgs []*Message) error
}

// Unit applies batches of messages exactly once.
type Unit struct {
	pool *pgxpool.Pool
	cfg  Config
}

// New returns a Unit on pool.
func New(pool *pgxpool.Pool, cfg *Config) (*Unit, error) {
	if pool == nil {
		return nil, errors.New("exactlyonce: pool is required")
	}
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	if c.Processed == nil {
		c.Processed = processed.Default
	}
	if c.BackoffMin <= 0 {
		c.BackoffMin = 50 * time.Millisecond
	}
	if c.BackoffMax <= 0 {
		c.BackoffMax = 5 * time.Second
	}
	if c.BackoffMax < c.BackoffMin {
		return nil, fmt.Errorf("exactlyonce: BackoffMax (%s) is below BackoffMin (%s)", c.BackoffMax, c.BackoffMin)
	}
	if c.Logger == nil {
		c.Logger = logrus.NewEntry(logrus.StandardLogger())
	}
	return &Unit{pool: pool, cfg: c}, nil
}

// Processed returns the store the unit claims in.
func (u *Unit) Processed() *processed.Store { return u.cfg.Processed }

// effectTx begins every effect transaction with deferred constraints checked at once: a
// violation then fails its own statement, inside its message's savepoint, instead of the
// COMMIT of the whole batch, where no message could be blamed for it. Same round trip.
var effectTx = pgx.TxOptions{BeginQuery: "BEGIN; SET CONSTRAINTS ALL IMMEDIATE"}

// errCareful asks Apply to run the batch again with a savepoint around each effect.
var errCareful = errors.New("a permanent failure needs savepoints")

// Apply runs msgs in one transaction and returns once it committed, with every message's
// Outcome set. It retries transient failures until ctx ends; it returns an error only when
// ctx ends or a failure is neither transient nor attributable to one message.
func (u *Unit) Apply(ctx context.Context, msgs []*Message) error {
	if len(msgs) == 0 {
		return nil
	}
	careful := false
	for attempt := 0; ; attempt++ {
		err := u.try(ctx, msgs, careful)
		if err == nil {
			return nil
		}
		if errors.Is(err, errCareful) {
			careful = true
			attempt--
			continue
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !retryable(err) {
			return err
		}
		if u.cfg.OnRetry != nil {
			u.cfg.OnRetry(err)
		}
		wait := u.backoff(attempt)
		u.cfg.Logger.WithError(err).WithField("retry_in", wait.String()).WithField("messages", len(msgs)).
			Warn("transient failure applying a batch; retrying it")
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// retryable: transient database errors and errors nobody marked permanent. An effect that
// returns a plain error is retried, never skipped.
func retryable(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	return !IsPermanent(err)
}

func (u *Unit) backoff(attempt int) time.Duration {
	return retry.Backoff(u.cfg.BackoffMin, u.cfg.BackoffMax, attempt+1)
}

func (u *Unit) try(ctx context.Context, msgs []*Message, careful bool) (err error) {
	for _, m := range msgs {
		m.Outcome, m.Response, m.Record, m.ConflictCount, m.Attempts, m.Cause = Pending, nil, nil, 0, 0, nil
		m.Careful = careful
	}
	tx, err := u.begin(ctx)
	if err != nil {
		return err
	}
	defer rollbackOnError(ctx, tx, &err)

	claims := make([]processed.Claim, len(msgs))
	for i, m := range msgs {
		claims[i] = processed.Claim{
			Scope: m.Scope, MessageID: m.ID, Fingerprint: m.Fingerprint, Retention: m.Retention, Payload: m.Payload,
		}
	}
	results, err := u.cfg.Processed.ClaimBatchTx(ctx, tx, claims)
	if err != nil {
		return err
	}

	var done []processed.Completion
	for i, m := range msgs {
		r := results[i]
		switch r.Outcome {
		case processed.Duplicate:
			m.Outcome, m.Record = Duplicate, r.Record
			if r.Record != nil {
				m.Response = r.Record.Response
			}
			continue
		case processed.Conflict:
			m.Outcome, m.Record, m.ConflictCount = Conflict, r.Record, r.ConflictCount
			continue
		case processed.InFlight:
			m.Outcome, m.Record = InFlight, r.Record
			continue
		}
		if err := u.run(ctx, tx, m, careful); err != nil {
			return err
		}
		if m.Outcome == DeadLettered || m.StoreResponse {
			done = append(done, completion(m, uuid.Nil))
		}
	}
	if u.cfg.Flush != nil {
		if err := u.cfg.Flush(ctx, tx, msgs); err != nil {
			if !careful && IsPermanent(err) {
				return errCareful
			}
			return err
		}
	}
	if err := u.cfg.Processed.CompleteBatchTx(ctx, tx, done); err != nil {
		return err
	}
	// Repeats inside the batch answer like their first occurrence once it is decided.
	for i, m := range msgs {
		if j := results[i].FirstIndex; j >= 0 && m.Outcome == Duplicate {
			m.Response = msgs[j].Response
		}
	}
	return u.commit(ctx, tx, msgs)
}

// begin starts an effect transaction (effectTx).
func (u *Unit) begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := u.pool.BeginTx(ctx, effectTx)
	if err != nil {
		return nil, fmt.Errorf("error beginning transaction: %w", err)
	}
	return tx, nil
}

// rollbackOnError rolls tx back when *errp is set, joining a rollback failure to it. The
// rollback runs even when ctx is the reason for leaving.
func rollbackOnError(ctx context.Context, tx pgx.Tx, errp *error) {
	if *errp == nil {
		return
	}
	if err := tx.Rollback(context.WithoutCancel(ctx)); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		*errp = errors.Join(*errp, fmt.Errorf("error rolling back: %w", err))
	}
}

// completion is the record update of a message whose effect ran: done or dead, with its
// response when the message stores one, guarded by token for a reservation.
func completion(m *Message, token uuid.UUID) processed.Completion {
	c := processed.Completion{Scope: m.Scope, MessageID: m.ID, State: processed.StateDone, LeaseToken: token}
	if m.Outcome == DeadLettered {
		c.State = processed.StateDead
	}
	if m.StoreResponse {
		c.Response = m.Response
	}
	return c
}

// commit runs the BeforeCommit hook (tests crash there) and commits.
func (u *Unit) commit(ctx context.Context, tx pgx.Tx, msgs []*Message) error {
	if u.cfg.BeforeCommit != nil {
		u.cfg.BeforeCommit(msgs)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("error committing: %w", err)
	}
	return nil
}

// run applies one claimed message's effect. Without careful, a permanent failure abandons
// the transaction (errCareful); with it, each attempt has its own savepoint.
func (u *Unit) run(ctx context.Context, tx pgx.Tx, m *Message, careful bool) error {
	if m.Effect == nil {
		m.Outcome, m.Attempts = Applied, 1
		return nil
	}
	if !careful {
		m.Attempts = 1
		resp, err := m.Effect(ctx, tx, m)
		if err != nil {
			if IsPermanent(err) {
				return errCareful
			}
			return err
		}
		m.Outcome, m.Response = Applied, resp
		return nil
	}

	maxAttempts := max(m.MaxAttempts, 1)
	var cause error
	for m.Attempts < maxAttempts {
		m.Attempts++
		resp, err := savepoint(ctx, tx, func(sp pgx.Tx) (*processed.Response, error) { return m.Effect(ctx, sp, m) })
		if err == nil {
			m.Outcome, m.Response = Applied, resp
			return nil
		}
		if !IsPermanent(err) {
			return err
		}
		cause = err
	}
	m.Outcome, m.Cause = DeadLettered, cause
	if m.DeadLetter == nil {
		return nil
	}
	resp, err := savepoint(ctx, tx, func(sp pgx.Tx) (*processed.Response, error) { return m.DeadLetter(ctx, sp, m, cause) })
	if err != nil {
		// A dead letter that cannot be written is not the message's fault: retry all.
		return fmt.Errorf("error dead-lettering message %q: %w", m.ID, err)
	}
	m.Response = resp
	return nil
}

func savepoint(ctx context.Context, tx pgx.Tx, fn func(pgx.Tx) (*processed.Response, error)) (*processed.Response, error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("error creating savepoint: %w", err)
	}
	resp, err := fn(sp)
	if err != nil {
		if rbErr := sp.Rollback(ctx); rbErr != nil {
			return nil, errors.Join(err, fmt.Errorf("error rolling back to savepoint: %w", rbErr))
		}
		return nil, err
	}
	if err := sp.Commit(ctx); err != nil {
		return nil, fmt.Errorf("error releasing savepoint: %w", err)
	}
	return resp, nil
}

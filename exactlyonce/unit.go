// Package exactlyonce is the unit of work every door of idemd hands its messages to: in one
// PostgreSQL transaction it claims a batch of message ids, runs the effect of each new one,
// writes what it enqueues (outbox rows) or its dead letter, stores its answer, and records
// the result. Guarantee: a message's effect commits together with its processed row or not
// at all, so it is applied at most once per (scope, id); Apply returns only after the
// commit, so a door that acknowledges after Apply acknowledges only what is durable.
//
// A door builds Messages — plain data: the key, the fingerprint, the bound effect, the
// events, the letter — and the unit does the rest, once for every door:
//   - statements whose result nobody needs are queued and sent in one round trip;
//   - transient failures (connection loss, serialization failure, deadlock…) roll the
//     whole batch back and retry it with capped, jittered backoff; no message is skipped;
//   - a permanent failure (classes 22, 23, 42, or an error marked Permanent) re-runs the
//     batch with a savepoint around each effect, so that one poison message never fails
//     its neighbours; the poison one is tried MaxAttempts times, then dead-lettered in the
//     transaction that marks it processed;
//   - an id held by another claimer's reservation is tried again until it is released;
//   - a COMMIT that ends without an answer (connection lost, timeout) is resolved by asking
//     PostgreSQL whether the transaction committed, so that its messages are reported as
//     what they are rather than retried into "duplicate";
//   - dead letters are replayed through the same code (ReplayTx).
package exactlyonce

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sirupsen/logrus"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/internal/pgarray"
	"github.com/idemd/idemd/internal/pgerr"
	"github.com/idemd/idemd/internal/retry"
	"github.com/idemd/idemd/internal/tracing"
	"github.com/idemd/idemd/migrations"
	"github.com/idemd/idemd/outbox"
	"github.com/idemd/idemd/processed"
)

// Defaults of Config.
const (
	BackoffMinDefault     = 50 * time.Millisecond
	BackoffMaxDefault     = 5 * time.Second
	ResolveTimeoutDefault = 10 * time.Second
)

// Config configures a Unit.
type Config struct {
	// Schema holds idemd's tables. Defaults to "idemd".
	Schema string
	// Processed is the store of claims. Defaults to a store on Schema with its defaults.
	Processed *processed.Store
	// BackoffMin is the first wait after a transient failure. Defaults to 50 ms.
	BackoffMin time.Duration
	// BackoffMax caps the wait between retries. Defaults to 5 s.
	BackoffMax time.Duration
	// GiveUpUnreachable makes Apply return at once, without retrying, when no connection to
	// PostgreSQL can be opened (pgerr.IsUnreachable: refused, handshake cut, authentication
	// refused…). A door whose sender waits for the answer (HTTP) sets it: while the database
	// is down it answers "retry later" within milliseconds instead of holding each request
	// until its timeout, and the sender's retry is the retry. Every other transient failure
	// (serialization failure, deadlock, a connection lost mid-transaction) is still retried
	// until ctx ends, on another connection. Defaults to false: retry until ctx ends.
	GiveUpUnreachable bool
	// ResolveTimeout bounds how long the outcome of a COMMIT that ended without an answer
	// is asked for on another connection. Defaults to 10 s.
	ResolveTimeout time.Duration
	// Logger receives one line per retried failure. Defaults to logrus's standard logger.
	Logger *logrus.Entry
	// OnRetry, when set, is called after each transient failure (metrics). Defaults to nil.
	OnRetry func(err error)
	// BeforeCommit, when set, runs just before COMMIT; tests crash there. Defaults to nil.
	BeforeCommit func(msgs []*Message)
	// TracerProvider records the unit's spans: the transaction, each run of an effect, each
	// outbox enqueue. Defaults to OpenTelemetry's global provider; while that is a no-op
	// one (tracing off), no span is made.
	TracerProvider trace.TracerProvider
	// Handoff, when set, passes the outbox rows of each committed batch to the relay of this
	// process (outbox.Handoff; give the same one to outbox.RelayConfig.Handoff), so that a
	// leading relay publishes them without reading them back. Optional.
	Handoff *outbox.Handoff
}

// Unit applies batches of messages exactly once.
type Unit struct {
	pool     *pgxpool.Pool
	cfg      Config
	outbox   *outbox.Store
	letters  *deadletter.Store
	guardSQL string
	tracer   *tracing.Tracer
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
	c.Schema = cmp.Or(c.Schema, migrations.SchemaDefault)
	c.BackoffMin = cmp.Or(c.BackoffMin, BackoffMinDefault)
	c.BackoffMax = cmp.Or(c.BackoffMax, BackoffMaxDefault)
	c.ResolveTimeout = cmp.Or(c.ResolveTimeout, ResolveTimeoutDefault)
	switch {
	case c.BackoffMin < 0, c.BackoffMax < 0, c.ResolveTimeout < 0:
		return nil, errors.New("exactlyonce: BackoffMin, BackoffMax and ResolveTimeout must not be negative")
	case c.BackoffMax < c.BackoffMin:
		return nil, fmt.Errorf("exactlyonce: BackoffMax (%s) is below BackoffMin (%s)", c.BackoffMax, c.BackoffMin)
	}
	if c.Processed == nil {
		p, err := processed.New(&processed.Config{Schema: c.Schema})
		if err != nil {
			return nil, fmt.Errorf("exactlyonce: %w", err)
		}
		c.Processed = p
	}
	if c.Logger == nil {
		c.Logger = logrus.NewEntry(logrus.StandardLogger())
	}
	return &Unit{
		pool:     pool,
		cfg:      c,
		outbox:   outbox.New(&outbox.Config{Schema: c.Schema, Handoff: c.Handoff}),
		letters:  deadletter.New(c.Schema),
		guardSQL: guardSQL(c.Schema),
		tracer:   tracing.NewTracer(c.TracerProvider, tracerScope),
	}, nil
}

// Processed returns the store the unit claims in.
func (u *Unit) Processed() *processed.Store { return u.cfg.Processed }

// Every effect transaction checks deferred constraints at once: a violation then fails
// its own statement, inside its message's savepoint, instead of the COMMIT of the whole
// batch, where no message could be blamed for it. In the round trip of BEGIN: effectTx
// (simple protocol), or the claim's batch (try).
const setConstraintsImmediate = "SET CONSTRAINTS ALL IMMEDIATE"

var effectTx = pgx.TxOptions{BeginQuery: "BEGIN; " + setConstraintsImmediate}

// errCareful asks for the batch to run again with a savepoint around each effect.
var errCareful = errors.New("a permanent failure needs savepoints")

// Apply runs msgs in one transaction and returns once it committed, with every message's
// Result set. It retries transient failures, and messages held in flight by another
// claimer, until ctx ends; it returns an error only when ctx ends, when a failure is neither
// transient nor attributable to one message (a missing table, say), or, with
// Config.GiveUpUnreachable, when no connection to the database can be opened.
func (u *Unit) Apply(ctx context.Context, msgs []*Message) (err error) {
	ctx, span := u.startTx(ctx, msgs)
	if span != nil {
		defer func() { tracing.End(span, err) }()
	}
	todo := msgs
	for attempt := 1; ; attempt++ {
		if err := u.applyOnce(ctx, todo); err != nil {
			return err
		}
		var held []*Message
		for _, m := range todo {
			if m.Outcome == InFlight {
				held = append(held, m)
			}
		}
		if len(held) == 0 {
			return nil
		}
		// A reservation holds these ids (an API request in progress in the same scope, or
		// a row pruned between two statements): ask again once it may have ended.
		todo = held
		if err := u.sleep(ctx, attempt); err != nil {
			return err
		}
	}
}

func (u *Unit) applyOnce(ctx context.Context, msgs []*Message) error {
	careful := false
	for attempt := 1; ; {
		err := u.try(ctx, msgs, careful)
		if err == nil {
			return nil
		}
		if errors.Is(err, errCareful) {
			careful = true
			if span := trace.SpanFromContext(ctx); span.IsRecording() {
				span.AddEvent("savepoints") // a permanent failure: again, one savepoint per effect
			}
			continue
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !retryable(err) {
			return err
		}
		if u.cfg.GiveUpUnreachable && pgerr.IsUnreachable(err) {
			return err
		}
		if u.cfg.OnRetry != nil {
			u.cfg.OnRetry(err)
		}
		if span := trace.SpanFromContext(ctx); span.IsRecording() {
			span.AddEvent("retry", trace.WithAttributes(semconv.ErrorTypeKey.String(tracing.ErrorType(err))))
		}
		u.cfg.Logger.WithError(err).WithField("attempt", attempt).WithField("messages", len(msgs)).
			Warn("transient failure applying a batch; retrying it")
		if err := u.sleep(ctx, attempt); err != nil {
			return err
		}
		attempt++
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

func (u *Unit) sleep(ctx context.Context, attempt int) error {
	t := time.NewTimer(retry.Backoff(u.cfg.BackoffMin, u.cfg.BackoffMax, attempt))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// claimSet maps messages to the claims of one batch: each message's own key, then its Also
// keys.
type claimSet struct {
	claims []processed.Claim
	own    []int   // claims index of each message's key
	also   [][]int // claims indexes of each message's Also keys
	owner  []int   // message index of each claim
}

func newClaimSet(msgs []*Message, reserve bool) *claimSet {
	cs := &claimSet{
		own: make([]int, len(msgs)), also: make([][]int, len(msgs)),
		claims: make([]processed.Claim, 0, len(msgs)), owner: make([]int, 0, len(msgs)),
	}
	add := func(i int, c processed.Claim) int {
		cs.claims = append(cs.claims, c)
		cs.owner = append(cs.owner, i)
		return len(cs.claims) - 1
	}
	for i, m := range msgs {
		cs.own[i] = add(i, processed.Claim{Scope: m.Scope, MessageID: m.ID, Fingerprint: m.Fingerprint, Retention: m.Retention, Payload: m.Payload, Reserve: reserve})
		for _, k := range m.Also {
			cs.also[i] = append(cs.also[i], add(i, processed.Claim{Scope: k.Scope, MessageID: k.ID, Fingerprint: k.Fingerprint, Retention: m.Retention}))
		}
	}
	return cs
}

// decide sets m's outcome from its claims' results; it returns whether m is new, and the
// claims m made but must not keep (Also keys claimed for a message that is not new, or a
// new key whose Also key is held by someone else).
func (cs *claimSet) decide(i int, m *Message, results []processed.Result, msgs []*Message) (bool, []processed.Claim) {
	own := results[cs.own[i]]
	var forget []processed.Claim
	forgetAlso := func() {
		for _, j := range cs.also[i] {
			if results[j].Outcome == processed.Claimed {
				forget = append(forget, cs.claims[j])
			}
		}
	}
	switch own.Outcome {
	case processed.Duplicate:
		m.Outcome, m.Record = Duplicate, own.Record
		if own.Record != nil {
			m.Response = own.Record.Response
		}
		forgetAlso()
		return false, forget
	case processed.Conflict:
		m.Outcome, m.Record, m.ConflictCount = Conflict, own.Record, own.ConflictCount
		forgetAlso()
		return false, forget
	case processed.InFlight:
		m.Outcome, m.Record = InFlight, own.Record
		forgetAlso()
		return false, forget
	}
	for _, j := range cs.also[i] {
		r := results[j]
		if first := r.FirstIndex; first >= 0 && msgs[cs.owner[first]].Outcome != Applied && msgs[cs.owner[first]].Outcome != Pending {
			// Known from a message of this batch that was not applied: ask again in a
			// later transaction, once that one's claim is settled.
			r.Outcome = processed.InFlight
		}
		switch r.Outcome {
		case processed.Duplicate, processed.Conflict:
			// The same signed bytes arrived before under another id: the new id is
			// recorded as a duplicate delivery and nothing runs.
			m.Outcome, m.Record = Duplicate, r.Record
			forgetAlso()
			return false, forget
		case processed.InFlight:
			m.Outcome, m.Record = InFlight, r.Record
			forgetAlso()
			return false, append(forget, cs.claims[cs.own[i]])
		}
	}
	return true, nil
}

func (u *Unit) try(ctx context.Context, msgs []*Message, careful bool) (err error) {
	for _, m := range msgs {
		m.Result = Result{}
	}
	conn, err := u.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("error beginning transaction: %w", err)
	}
	// Released after the transaction ended (the pool closes a connection left in one). The
	// unit holds the connection rather than a pool transaction so that it can commit in the
	// round trip of its last statements (sendCommit).
	defer conn.Release()

	// BEGIN goes in the round trip of the claim.
	begin := &pgx.Batch{}
	begin.BeginTx(pgx.TxOptions{})
	begin.Queue(setConstraintsImmediate)
	cs := newClaimSet(msgs, false)
	tx, results, xid, err := u.cfg.Processed.ClaimBatchBeginXact(ctx, processed.Begin{Conn: conn.Conn(), Batch: begin}, cs.claims)
	if tx != nil {
		defer rollbackOnError(ctx, tx, &err)
	}
	if err != nil {
		return err
	}
	q := &queue{direct: careful, size: len(msgs)}
	defer func() { q.endSpans(err) }()
	var (
		done   []processed.Completion
		forget []processed.Claim
	)
	for i, m := range msgs {
		isNew, drop := cs.decide(i, m, results, msgs)
		forget = append(forget, drop...)
		if !isNew {
			continue
		}
		if careful {
			err = u.runCareful(messageContext(ctx, m), tx, m, q)
		} else {
			err = u.run(messageContext(ctx, m), tx, m, q)
		}
		if err != nil {
			return err
		}
		if m.Outcome == DeadLettered || m.Answer != nil {
			done = append(done, completion(m))
		}
	}
	// Repeats inside the batch answer like their first occurrence once it is decided.
	for i, m := range msgs {
		if j := results[cs.own[i]].FirstIndex; j >= 0 && m.Outcome == Duplicate {
			m.Response = msgs[cs.owner[j]].Response
		}
	}
	if !careful && len(forget) == 0 && len(done) == 0 {
		// Nothing is left to run after what is queued: COMMIT goes in the same round trip.
		// A batch of new webhooks or records takes two round trips in all: BEGIN and the
		// claim; the effects, the events and COMMIT.
		if err := u.sendCommit(ctx, tx, q, msgs, xid); err != nil {
			return err
		}
		u.committed(q)
		return nil
	}
	if err := u.sendIf(ctx, tx, q); err != nil {
		if IsPermanent(err) {
			return errCareful
		}
		return err
	}
	if err := u.cfg.Processed.ForgetTx(ctx, tx, forget); err != nil {
		return err
	}
	if err := u.cfg.Processed.CompleteBatchTx(ctx, tx, done); err != nil {
		return err
	}
	if err := u.commit(ctx, tx, msgs, xid); err != nil {
		return err
	}
	u.committed(q)
	return nil
}

// committed hands the outbox rows of q's committed transaction to the relay of this process
// (Config.Handoff), and wakes the listeners of the rest with a NOTIFY: the relay too when
// it could not take them.
func (u *Unit) committed(q *queue) {
	w := q.wake
	if len(q.handed) > 0 && !u.outbox.HandOver(q.handed) {
		w |= outbox.WakeRelay
	}
	u.outbox.Notify(u.pool, w)
}

// begin starts an effect transaction (effectTx) on a connection of its own; release returns
// the connection to the pool (closed if it is still in a transaction), after the
// transaction ended.
func (u *Unit) begin(ctx context.Context) (tx pgx.Tx, release func(), err error) {
	conn, err := u.pool.Acquire(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("error beginning transaction: %w", err)
	}
	tx, err = conn.BeginTx(ctx, effectTx)
	if err != nil {
		conn.Release()
		return nil, nil, fmt.Errorf("error beginning transaction: %w", err)
	}
	return tx, conn.Release, nil
}

// sendCommit sends what q holds and COMMIT in one round trip: the transaction's last two
// round trips become one. When a statement fails,
// PostgreSQL skips the rest of the pipeline, COMMIT included, and the transaction is rolled
// back as after any failure: an effect's permanent failure still re-runs the batch with
// savepoints (errCareful). A failure without an answer is resolved as commit resolves it.
func (u *Unit) sendCommit(ctx context.Context, tx pgx.Tx, q *queue, msgs []*Message, xid string) error {
	if err := u.complete(q); err != nil {
		return errCareful // an event refused for good, as after send
	}
	if u.cfg.BeforeCommit != nil {
		u.cfg.BeforeCommit(msgs)
	}
	q.batch.Queue("COMMIT")
	pgarray.Reserve(tx.Conn(), &q.batch)
	err := tx.SendBatch(ctx, &q.batch).Close()
	q.batch = pgx.Batch{}
	q.endSpans(err)
	if err == nil {
		return nil
	}
	if IsPermanent(err) {
		return errCareful
	}
	err = fmt.Errorf("error running the batch's effects and COMMIT: %w", err)
	if !outcomeUnknown(err) || xid == "" {
		return err
	}
	return u.resolved(ctx, err, msgs, xid)
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
// answer when it has one.
func completion(m *Message) processed.Completion {
	c := processed.Completion{Scope: m.Scope, MessageID: m.ID, State: processed.StateDone}
	if m.Outcome == DeadLettered {
		c.State = processed.StateDead
	}
	if m.Answer != nil {
		c.Response = m.Response
	}
	return c
}

// ErrCommitUnknown: a COMMIT ended without an answer and the database could not be asked
// whether it committed within Config.ResolveTimeout. Nothing is lost either way: a retry of
// the messages is recognised by their processed rows if it did.
var ErrCommitUnknown = errors.New("the outcome of COMMIT is unknown")

// commit runs the BeforeCommit hook (tests crash there) and commits. When COMMIT ends
// without an answer, it asks another connection whether transaction xid committed.
func (u *Unit) commit(ctx context.Context, tx pgx.Tx, msgs []*Message, xid string) error {
	if u.cfg.BeforeCommit != nil {
		u.cfg.BeforeCommit(msgs)
	}
	err := tx.Commit(ctx)
	if err == nil {
		return nil
	}
	err = fmt.Errorf("error committing: %w", err)
	if !outcomeUnknown(err) || xid == "" {
		return err
	}
	return u.resolved(ctx, err, msgs, xid)
}

// resolved is the outcome of a COMMIT that ended with err and no answer: nil when the
// database says transaction xid committed.
func (u *Unit) resolved(ctx context.Context, err error, msgs []*Message, xid string) error {
	committed, rerr := u.resolve(ctx, xid)
	switch {
	case rerr != nil:
		return errors.Join(err, rerr)
	case committed:
		u.cfg.Logger.WithError(err).WithField("messages", len(msgs)).
			Warn("COMMIT ended without an answer; the database says it committed")
		return nil
	default:
		return err
	}
}

// outcomeUnknown: COMMIT was sent (or may have been) and no answer came back. A server
// error, or a failure before anything was sent, leaves no doubt: nothing committed.
func outcomeUnknown(err error) bool {
	var pgErr *pgconn.PgError
	return !errors.As(err, &pgErr) && !errors.Is(err, pgx.ErrTxCommitRollback) && !pgconn.SafeToRetry(err)
}

// resolve asks, on another connection, whether transaction xid committed. While the server
// still reports it in progress (its backend has not yet noticed the lost connection), it
// asks again. It gives up after ResolveTimeout with ErrCommitUnknown.
func (u *Unit) resolve(ctx context.Context, xid string) (bool, error) {
	// The caller's ctx may be what ended the COMMIT (its timeout fired during it).
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), u.cfg.ResolveTimeout)
	defer cancel()
	var last error
	for attempt := 1; ; attempt++ {
		var status *string
		err := u.pool.QueryRow(rctx, `SELECT pg_xact_status($1::xid8)`, xid).Scan(&status)
		switch {
		case err == nil && status != nil && *status == "committed":
			return true, nil
		case err == nil && status != nil && *status == "aborted":
			return false, nil
		case err == nil:
			last = fmt.Errorf("transaction %s is still in progress", xid)
		default:
			last = err
		}
		if err := u.sleep(rctx, attempt); err != nil {
			return false, fmt.Errorf("%w: %w", ErrCommitUnknown, last)
		}
	}
}

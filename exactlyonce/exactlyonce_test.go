package exactlyonce_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/exactlyonce"
	"github.com/idemd/idemd/internal/pgerr"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/outbox"
	"github.com/idemd/idemd/processed"
)

type bundle struct {
	db   *pgtest.DB
	unit *exactlyonce.Unit
}

func setup(t *testing.T) *bundle {
	t.Helper()
	db := pgtest.New(t)
	db.Exec(t, db.Q("CREATE TABLE {schema}.effects (id text PRIMARY KEY, n int NOT NULL CHECK (n >= 0))"))
	return &bundle{db: db, unit: newUnit(t, db, db.Pool, nil)}
}

func newUnit(t testing.TB, db *pgtest.DB, pool *pgxpool.Pool, hook func(*exactlyonce.Config)) *exactlyonce.Unit {
	t.Helper()
	l := logrus.New()
	l.SetLevel(logrus.ErrorLevel)
	cfg := &exactlyonce.Config{Schema: db.Schema, BackoffMin: time.Millisecond, BackoffMax: 10 * time.Millisecond, Logger: logrus.NewEntry(l)}
	if hook != nil {
		hook(cfg)
	}
	unit, err := exactlyonce.New(pool, cfg)
	require.NoError(t, err)
	return unit
}

// insert is the SQL effect inserting (id, n); a negative n violates the CHECK constraint,
// a permanent failure.
func (b *bundle) insert(id string, n int) exactlyonce.Effect {
	return exactlyonce.Effect{SQL: b.db.Q("INSERT INTO {schema}.effects VALUES ($1, $2) RETURNING id"), Args: []any{id, n}}
}

// msg is a message whose effect inserts (id, n) and whose answer is stored.
func (b *bundle) msg(id string, n int) *exactlyonce.Message {
	return &exactlyonce.Message{Scope: "s", ID: id, Fingerprint: []byte("fp"), Effect: b.insert(id, n),
		Answer: &exactlyonce.Answer{Status: 200, Failed: func(cause error) *processed.Response {
			return &processed.Response{Status: 422, Body: []byte("dead")}
		}}}
}

func TestPoisonMessageDoesNotFailNeighbours(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var batch []*exactlyonce.Message
	for i := 0; i < 100; i++ {
		m := b.msg(fmt.Sprintf("good-%d", i), i)
		m.Answer = nil // queued on the fast path
		batch = append(batch, m)
	}
	poison := b.msg("poison", -1)
	poison.Answer = nil
	poison.MaxAttempts = 3
	poison.Letter = &deadletter.Letter{Pipeline: "s", Origin: deadletter.Origin{Door: deadletter.DoorKafka}, Scope: "s", MessageID: "poison"}
	batch = append(batch[:50], append([]*exactlyonce.Message{poison}, batch[50:]...)...)

	require.NoError(t, b.unit.Apply(context.Background(), batch))
	require.Equal(t, 100, b.db.Count(t, "{schema}.effects"))
	require.Equal(t, exactlyonce.DeadLettered, poison.Outcome)
	require.Equal(t, 3, poison.Attempts)
	require.ErrorContains(t, poison.Cause, "23514")
	require.Equal(t, 1, b.db.Count(t, "{schema}.dead_letters WHERE message_id = 'poison' AND attempts = 3 AND reason LIKE '%23514%' AND door = 'kafka'"))
	require.Equal(t, 1, b.db.Count(t, "{schema}.processed_messages WHERE status = 'dead'"))
	require.Equal(t, 100, b.db.Count(t, "{schema}.processed_messages WHERE status = 'done'"))

	// Redelivered, the whole batch is duplicates, the poison one included.
	require.NoError(t, b.unit.Apply(context.Background(), batch))
	for _, m := range batch {
		require.Equal(t, exactlyonce.Duplicate, m.Outcome, m.ID)
	}
	require.Equal(t, 1, b.db.Count(t, "{schema}.dead_letters"))
}

func TestAnswersAreStoredAndReplayed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ok, bad := b.msg("a", 1), b.msg("b", -1)
	require.NoError(t, b.unit.Apply(context.Background(), []*exactlyonce.Message{ok, bad}))
	require.Equal(t, exactlyonce.Applied, ok.Outcome)
	require.JSONEq(t, `{"id":"a"}`, string(ok.Response.Body), "the returned row is the answer")
	require.Equal(t, exactlyonce.DeadLettered, bad.Outcome)
	require.Equal(t, 422, bad.Response.Status)

	again := []*exactlyonce.Message{b.msg("a", 1), b.msg("b", -1)}
	require.NoError(t, b.unit.Apply(context.Background(), again))
	require.Equal(t, exactlyonce.Duplicate, again[0].Outcome)
	require.Equal(t, ok.Response.Body, again[0].Response.Body)
	require.Equal(t, 422, again[1].Response.Status)
}

func TestTransientFailureRetriesWholeBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls atomic.Int32
	flaky := b.msg("b", 1)
	flaky.Effect.Func = serializationFailures(2, &calls)
	batch := []*exactlyonce.Message{b.msg("a", 1), flaky}
	require.NoError(t, b.unit.Apply(context.Background(), batch))
	require.Equal(t, 2, b.db.Count(t, "{schema}.effects"))
	require.Equal(t, exactlyonce.Applied, batch[0].Outcome)
	require.Equal(t, exactlyonce.Applied, batch[1].Outcome)
	require.EqualValues(t, 3, calls.Load())
}

func TestRepeatsInsideOneBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first, repeat, conflict := b.msg("x", 1), b.msg("x", 1), b.msg("x", 1)
	conflict.Fingerprint = []byte("other")
	require.NoError(t, b.unit.Apply(context.Background(), []*exactlyonce.Message{first, repeat, conflict}))
	require.Equal(t, exactlyonce.Applied, first.Outcome)
	require.Equal(t, exactlyonce.Duplicate, repeat.Outcome)
	require.Equal(t, first.Response.Body, repeat.Response.Body, "a repeat answers like its first occurrence")
	require.Equal(t, exactlyonce.Conflict, conflict.Outcome)
	require.Equal(t, 1, b.db.Count(t, "{schema}.effects"))
	require.Equal(t, 1, b.db.Count(t, "{schema}.conflicts"))
}

func TestApplyStopsWithContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m := b.msg("a", 1)
	m.Effect = exactlyonce.Effect{Func: func(context.Context, pgx.Tx) (any, error) {
		return nil, errors.New("downstream unavailable") // not marked permanent: retried, never skipped
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, b.unit.Apply(ctx, []*exactlyonce.Message{m}), context.DeadlineExceeded)
	require.Zero(t, b.db.Count(t, "{schema}.processed_messages"), "nothing is marked for a message that never succeeded")
}

// TestDeferredConstraintBlamesItsMessage: an effect table with a deferred constraint. The
// violation is checked at the statement (SET CONSTRAINTS ALL IMMEDIATE), inside the poison
// message's savepoint, so its neighbours commit and it alone is dead-lettered; without it
// the violation would surface at COMMIT, where no message can be blamed.
func TestDeferredConstraintBlamesItsMessage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.db.Exec(t, b.db.Q("CREATE TABLE {schema}.deferred (k text, CONSTRAINT deferred_k UNIQUE (k) DEFERRABLE INITIALLY DEFERRED)"))
	b.db.Exec(t, b.db.Q("INSERT INTO {schema}.deferred VALUES ('taken')"))
	m := func(id, k string) *exactlyonce.Message {
		return &exactlyonce.Message{Scope: "s", ID: id, Fingerprint: []byte("fp"),
			Effect: exactlyonce.Effect{SQL: b.db.Q("INSERT INTO {schema}.deferred VALUES ($1)"), Args: []any{k}},
			Letter: &deadletter.Letter{Pipeline: "s", Origin: deadletter.Origin{Door: deadletter.DoorKafka}, Scope: "s", MessageID: id}}
	}
	batch := []*exactlyonce.Message{m("a", "a"), m("poison", "taken"), m("b", "b")}
	require.NoError(t, b.unit.Apply(context.Background(), batch))
	require.Equal(t, exactlyonce.Applied, batch[0].Outcome)
	require.Equal(t, exactlyonce.DeadLettered, batch[1].Outcome)
	require.Equal(t, exactlyonce.Applied, batch[2].Outcome)
	require.Equal(t, 1, b.db.Count(t, "{schema}.dead_letters"))
	require.Equal(t, 3, b.db.Count(t, "{schema}.deferred"))
}

// TestConcurrentSameID: many goroutines apply the same id at once, each in its own
// transaction: the effect runs once, every other one is a duplicate.
func TestConcurrentSameID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 32
	var wg sync.WaitGroup
	outcomes := make([]exactlyonce.Outcome, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := b.msg("same", 1)
			m.Answer = nil
			require.NoError(t, b.unit.Apply(context.Background(), []*exactlyonce.Message{m}))
			outcomes[i] = m.Outcome
		}()
	}
	wg.Wait()
	applied := 0
	for _, o := range outcomes {
		if o == exactlyonce.Applied {
			applied++
		} else {
			require.Equal(t, exactlyonce.Duplicate, o)
		}
	}
	require.Equal(t, 1, applied)
	require.Equal(t, 1, b.db.Count(t, "{schema}.effects"))
}

// TestEventsCommitWithTheEffect: a message's events are written in its transaction, with
// the result as payload when asked; a dead-lettered message's letter events carry the reason.
func TestEventsCommitWithTheEffect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ev := func(id string) outbox.Event {
		return outbox.Event{Topic: "out", Pipeline: "s", CausationID: id, Payload: []byte(`{"p":1}`), OperationID: outbox.OperationID("s", id, 0)}
	}
	a, c, bad := b.msg("a", 1), b.msg("c", 2), b.msg("bad", -1)
	a.Answer = nil
	a.Events = []exactlyonce.Event{{Event: ev("a")}}
	c.Events = []exactlyonce.Event{{Event: ev("c"), FromResult: true}}
	bad.Events = []exactlyonce.Event{{Event: ev("bad")}}
	bad.LetterEvents = []outbox.Event{{Topic: "dlq", Pipeline: "s", CausationID: "bad", Payload: []byte("x")}}
	require.NoError(t, b.unit.Apply(context.Background(), []*exactlyonce.Message{a, c, bad}))
	require.Equal(t, 1, b.db.Count(t, `{schema}.outbox WHERE causation_id = 'a' AND payload = '{"p":1}'`))
	require.Equal(t, 1, b.db.Count(t, `{schema}.outbox WHERE causation_id = 'c' AND payload = '{"id":"c"}'`), "the effect's row is the payload")
	require.Equal(t, 0, b.db.Count(t, `{schema}.outbox WHERE causation_id = 'bad' AND topic = 'out'`), "a failed effect's events roll back with it")
	require.Equal(t, 1, b.db.Count(t, `{schema}.outbox WHERE topic = 'dlq' AND headers->>'idemd-dead-letter-reason' LIKE '%23514%'`))
}

// TestEventsQueuedInPlace: on a batch's fast path, the events of applied messages and the
// letter events of an invalid one are made where they wait to be queued (phase 43): each
// message's own, none overwritten by the next one's, the letter's with its reason.
func TestEventsQueuedInPlace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var batch []*exactlyonce.Message
	for i := range 40 {
		id := fmt.Sprintf("m-%d", i)
		m := b.msg(id, i)
		m.Answer = nil
		if i%10 == 3 {
			m.Invalid = errors.New("no message id")
			m.Letter = &deadletter.Letter{Pipeline: "s", Origin: deadletter.Origin{Door: deadletter.DoorKafka}, Scope: "s"}
			m.LetterEvents = []outbox.Event{{Topic: "dlq", Pipeline: "s", CausationID: id, Payload: []byte(`"letter"`)}}
		} else {
			for k := range 2 {
				m.Events = append(m.Events, exactlyonce.Event{Event: outbox.Event{Topic: "out", Pipeline: "s", CausationID: id,
					Payload: fmt.Appendf(nil, `{"n":%d,"k":%d}`, i, k), OperationID: outbox.OperationID("s", id, k)}})
			}
		}
		batch = append(batch, m)
	}
	require.NoError(t, b.unit.Apply(context.Background(), batch))
	want := map[uuid.UUID]string{}
	for _, m := range batch {
		for _, e := range m.Events {
			want[e.OperationID] = e.CausationID + " " + string(e.Payload)
		}
	}
	rows, err := b.db.Pool.Query(context.Background(), `SELECT operation_id, causation_id || ' ' || convert_from(payload, 'UTF8')
FROM `+b.db.Schema+`.outbox WHERE topic = 'out'`)
	require.NoError(t, err)
	got := map[uuid.UUID]string{}
	for rows.Next() {
		var op uuid.UUID
		var row string
		require.NoError(t, rows.Scan(&op, &row))
		got[op] = row
	}
	require.NoError(t, rows.Err())
	require.Len(t, want, 72)
	require.Equal(t, want, got)
	// On the fast path: no savepoint, whose subtransactions would give the rows xmins of
	// their own (a bad event there is retried message by message, which would hide it).
	require.Equal(t, 1, b.db.Count(t, `(SELECT DISTINCT xmin::text FROM {schema}.outbox) x`))
	require.Equal(t, 4, b.db.Count(t, `{schema}.outbox WHERE topic = 'dlq' AND payload = '"letter"'
  AND causation_id IN ('m-3', 'm-13', 'm-23', 'm-33')`))
}

// TestInvalidIsDeadLetteredAtOnce: a message the door could not read is dead-lettered
// without running its effect, once.
func TestInvalidIsDeadLetteredAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m := b.msg("pos-1", 1)
	m.Answer = nil
	m.Invalid = errors.New("no message id")
	m.Letter = &deadletter.Letter{Pipeline: "s", Origin: deadletter.Origin{Door: deadletter.DoorKafka}, Scope: "s"}
	require.NoError(t, b.unit.Apply(context.Background(), []*exactlyonce.Message{m}))
	require.Equal(t, exactlyonce.DeadLettered, m.Outcome)
	require.Zero(t, b.db.Count(t, "{schema}.effects"))
	require.Equal(t, 1, b.db.Count(t, "{schema}.dead_letters WHERE reason = 'no message id'"))
	require.NoError(t, b.unit.Apply(context.Background(), []*exactlyonce.Message{m}))
	require.Equal(t, exactlyonce.Duplicate, m.Outcome)
	require.Equal(t, 1, b.db.Count(t, "{schema}.dead_letters"))
}

// countingLetterer makes a letter and a dead-letter topic event, and counts its calls.
type countingLetterer struct{ calls atomic.Int32 }

func (l *countingLetterer) DeadLetter(m *exactlyonce.Message) (*deadletter.Letter, []outbox.Event) {
	l.calls.Add(1)
	return &deadletter.Letter{Pipeline: "s", Origin: deadletter.Origin{Door: deadletter.DoorKafka}, Scope: "s", MessageID: m.ID},
		[]outbox.Event{{Topic: "dlq", Pipeline: "s", CausationID: m.ID, Payload: []byte("x")}}
}

// TestLettererRunsOnlyWhenDeadLettered: a door's Letterer makes the letter and its events
// of the message that is dead-lettered, once, after its attempts, and of no other.
func TestLettererRunsOnlyWhenDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	good, bad := b.msg("good", 1), b.msg("bad", -1)
	good.Answer, bad.Answer = nil, nil
	bad.MaxAttempts = 2
	var gl, bl countingLetterer
	good.Letterer, bad.Letterer = &gl, &bl
	require.NoError(t, b.unit.Apply(context.Background(), []*exactlyonce.Message{good, bad}))
	require.Equal(t, exactlyonce.Applied, good.Outcome)
	require.Equal(t, exactlyonce.DeadLettered, bad.Outcome)
	require.Zero(t, gl.calls.Load())
	require.EqualValues(t, 1, bl.calls.Load())
	require.Equal(t, 1, b.db.Count(t, "{schema}.dead_letters WHERE message_id = 'bad' AND attempts = 2 AND reason LIKE '%23514%'"))
	require.Equal(t, 1, b.db.Count(t, `{schema}.outbox WHERE topic = 'dlq' AND causation_id = 'bad' AND headers->>'idemd-dead-letter-reason' LIKE '%23514%'`))
	require.Zero(t, b.db.Count(t, "{schema}.dead_letters WHERE message_id = 'good'"))
}

// versioned is a message of entity E at version v, whose effect sets the entity's state.
func (b *bundle) versioned(v int) *exactlyonce.Message {
	id := fmt.Sprintf("v%d", v)
	return &exactlyonce.Message{Scope: "s", ID: id, Fingerprint: []byte(id),
		Guard: &exactlyonce.Guard{Scope: "s", Entity: "E", Version: fmt.Sprint(v)},
		Effect: exactlyonce.Effect{SQL: b.db.Q(`INSERT INTO {schema}.state VALUES ('E', $1)
			ON CONFLICT (entity) DO UPDATE SET version = excluded.version`), Args: []any{v}}}
}

// requireStale checks the records of ids: done, and marked stale (with entity E and the
// version in the id) exactly when stale says so.
func (b *bundle) requireStale(t *testing.T, stale map[string]bool) {
	t.Helper()
	for id, want := range stale {
		rec, err := b.unit.Processed().GetRecord(context.Background(), b.db.Pool, "s", id)
		require.NoError(t, err, id)
		require.Equal(t, processed.StateDone, rec.State, id)
		if !want {
			require.Nil(t, rec.Stale, id)
			continue
		}
		require.Equal(t, &processed.Stale{Entity: "E", Version: id[1:]}, rec.Stale, id)
	}
}

// TestGuardSkipsStaleMessages: versions of one entity, out of order and spread over
// batches: only newer ones run, the final state is the newest. The records of the skipped
// ones say so (the last of a batch's is marked in the round trip of COMMIT).
func TestGuardSkipsStaleMessages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.db.Exec(t, b.db.Q("CREATE TABLE {schema}.state (entity text PRIMARY KEY, version int)"))
	m := b.versioned
	first := []*exactlyonce.Message{m(3), m(1), m(5), m(4)}
	require.NoError(t, b.unit.Apply(context.Background(), first))
	require.Equal(t, []exactlyonce.Outcome{exactlyonce.Applied, exactlyonce.Stale, exactlyonce.Applied, exactlyonce.Stale},
		[]exactlyonce.Outcome{first[0].Outcome, first[1].Outcome, first[2].Outcome, first[3].Outcome})
	second := []*exactlyonce.Message{m(2), m(6)}
	require.NoError(t, b.unit.Apply(context.Background(), second))
	require.Equal(t, exactlyonce.Stale, second[0].Outcome)
	require.Equal(t, exactlyonce.Applied, second[1].Outcome)
	require.Equal(t, 1, b.db.Count(t, "{schema}.state WHERE version = 6"))
	b.requireStale(t, map[string]bool{"v1": true, "v2": true, "v3": false, "v4": true, "v5": false, "v6": false})

	again := []*exactlyonce.Message{m(2), m(6)}
	require.NoError(t, b.unit.Apply(context.Background(), again))
	require.Equal(t, exactlyonce.Duplicate, again[0].Outcome, "a stale message's redelivery")
	require.Equal(t, exactlyonce.Duplicate, again[1].Outcome)
}

// TestStaleMarkedWithSavepointsAndReservations: a stale message's record says so when its
// batch runs with savepoints (a poison neighbour), and when it was reserved first (the
// effect in a transaction of its own).
func TestStaleMarkedWithSavepointsAndReservations(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.db.Exec(t, b.db.Q("CREATE TABLE {schema}.state (entity text PRIMARY KEY, version int)"))
	poison := b.msg("poison", -1)
	poison.Answer = nil
	batch := []*exactlyonce.Message{b.versioned(5), poison, b.versioned(4)}
	require.NoError(t, b.unit.Apply(context.Background(), batch))
	require.Equal(t, []exactlyonce.Outcome{exactlyonce.Applied, exactlyonce.DeadLettered, exactlyonce.Stale},
		[]exactlyonce.Outcome{batch[0].Outcome, batch[1].Outcome, batch[2].Outcome})

	reserved := b.versioned(3)
	token, err := b.unit.Reserve(context.Background(), reserved, 0)
	require.NoError(t, err)
	require.NoError(t, b.unit.ApplyReserved(context.Background(), reserved, token))
	require.Equal(t, exactlyonce.Stale, reserved.Outcome)
	b.requireStale(t, map[string]bool{"v3": true, "v4": true, "v5": false})
}

// TestGiveUpUnreachable: with GiveUpUnreachable, Apply returns the connection failure at
// once while the database cannot be reached, and commits nothing; without it, Apply keeps
// retrying until its context ends. Other transient failures are still retried.
func TestGiveUpUnreachable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool, proxy := pgtest.OutagePool(t, 2)
	var retries atomic.Int32
	giveUp := newUnit(t, b.db, pool, func(c *exactlyonce.Config) {
		c.GiveUpUnreachable = true
		c.OnRetry = func(error) { retries.Add(1) }
	})
	patient := newUnit(t, b.db, pool, nil)

	proxy.SetDown(true)
	// The pool's idle connection was cut: a try on it would be a lost connection, which is
	// retried. Without it the try has to open one.
	pool.Reset()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := giveUp.Apply(ctx, []*exactlyonce.Message{b.msg("a", 1)})
	require.Error(t, err)
	require.True(t, pgerr.IsUnreachable(err), "%v", err)
	require.Zero(t, retries.Load(), "an unreachable database is not retried")
	require.NoError(t, ctx.Err(), "Apply returned long before its context ended")

	short, cancelShort := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancelShort()
	err = patient.Apply(short, []*exactlyonce.Message{b.msg("a", 1)})
	require.ErrorIs(t, err, context.DeadlineExceeded, "without GiveUpUnreachable it retries until ctx ends")
	require.Zero(t, b.db.Count(t, "{schema}.effects"))
	require.Zero(t, b.db.Count(t, "{schema}.processed_messages"))

	proxy.SetDown(false)
	var calls atomic.Int32
	flaky := b.msg("b", 1)
	flaky.Effect.Func = serializationFailures(2, &calls)
	batch := []*exactlyonce.Message{b.msg("a", 1), flaky}
	require.NoError(t, giveUp.Apply(ctx, batch))
	require.Equal(t, exactlyonce.Applied, batch[0].Outcome)
	require.Equal(t, exactlyonce.Applied, batch[1].Outcome)
	require.EqualValues(t, 2, retries.Load(), "serialization failures are still retried")
	require.Equal(t, 2, b.db.Count(t, "{schema}.effects"))
}

// serializationFailures is a Go effect that fails with a serialization failure (40001) on
// its first n calls, counted in calls, and succeeds after.
func serializationFailures(n int32, calls *atomic.Int32) func(context.Context, pgx.Tx) (any, error) {
	return func(context.Context, pgx.Tx) (any, error) {
		if calls.Add(1) <= n {
			return nil, &pgconn.PgError{Code: "40001", Message: "could not serialize access"}
		}
		return nil, nil
	}
}

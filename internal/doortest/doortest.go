// Package doortest is the conformance suite every door of idemd runs, as every adapter of
// watermill runs its pubsub tests: one set of cases, each a guarantee of SPEC 1, driven
// through the door's own protocol against real PostgreSQL and a real broker. A door
// provides a constructor (Door); Run does the rest.
//
// The cases: exactly once under concurrency (many deliveries of the same ids at once), a
// crash between commit and acknowledgement (the delivery is repeated and deduplicated), a
// poison message among good ones (dead-lettered, its neighbours applied), a conflict (same
// id, another payload: recorded, not applied), and the replay of a dead letter (applied
// once and counted once, a failing or second replay refused and not counted).
package doortest

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/internal/metricstest"
	"github.com/idemd/idemd/internal/pgtest"
)

// Env is what the suite gives a door: its database and the pipeline it must serve.
type Env struct {
	DB *pgtest.DB
	// Pipeline is the name of the door's pipeline, its own in the process (so are its
	// metrics): a source's path is /webhooks/ and this name.
	Pipeline string
	// EffectSQL is the pipeline's effect (pgx named arguments): it records @message_id and
	// @payload; a payload with "poison": true violates a constraint (a permanent failure).
	EffectSQL string
}

// Door is one door under test, serving Env's pipeline: message id JSON /id, effect
// Env.EffectSQL, one attempt before dead-lettering.
type Door interface {
	// Send delivers one message, whose body carries its id at /id, as the door's senders
	// do: an HTTP door posts it (and retries until it is answered, as a sender retries after
	// a timeout); a broker door publishes it.
	Send(t *testing.T, id string, body []byte)
	// Settle returns once the door acknowledged everything sent so far.
	Settle(t *testing.T)
	// CrashAfterCommit makes the door's next transaction commit and then die before it
	// acknowledges what it committed (the HTTP answer is lost; a consumer stops before its
	// offset commit or broker acknowledgement).
	CrashAfterCommit(t *testing.T)
	// Restart replaces a crashed door with a fresh one, as a supervisor restarts a process.
	Restart(t *testing.T)
	// RegisterReplay registers the door's replay of its letters with rp.
	RegisterReplay(t *testing.T, rp *deadletter.Replayer)
}

// Constructor starts a door for env. The door stops at the test's cleanup.
type Constructor func(t *testing.T, env *Env) Door

// Run runs every case against doors made by newDoor.
func Run(t *testing.T, newDoor Constructor) {
	t.Helper()
	for _, tc := range []struct {
		name string
		run  func(*testing.T, Constructor)
	}{
		{"ExactlyOnceUnderConcurrency", exactlyOnceUnderConcurrency},
		{"CrashBetweenCommitAndAck", crashBetweenCommitAndAck},
		{"PoisonAmongGood", poisonAmongGood},
		{"Conflict", conflict},
		{"ReplayDeadLetter", replayDeadLetter},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(t, newDoor)
		})
	}
}

func setup(t *testing.T, newDoor Constructor) (*Env, Door) {
	t.Helper()
	db := pgtest.NewWithOptions(t, pgtest.Options{MaxConns: 10})
	db.Exec(t, db.Q(`CREATE TABLE {schema}.effects (
    message_id text NOT NULL, body jsonb NOT NULL, CONSTRAINT no_poison CHECK (body->>'poison' IS NULL))`))
	env := &Env{DB: db, Pipeline: pgtest.SchemaName(t),
		EffectSQL: db.Q(`INSERT INTO {schema}.effects (message_id, body) VALUES (@message_id, @payload::jsonb)`)}
	return env, newDoor(t, env)
}

// Body is a message body with id at /id and the given extra JSON members.
func Body(id, extra string) []byte {
	if extra != "" {
		extra = "," + extra
	}
	return []byte(fmt.Sprintf(`{"id":%q,"object":"event"%s}`, id, extra))
}

func effects(t *testing.T, env *Env) (rows, distinct int) {
	t.Helper()
	return env.DB.Count(t, "{schema}.effects"), env.DB.Count(t, "(SELECT DISTINCT message_id FROM {schema}.effects) d")
}

// exactlyOnceUnderConcurrency: 50 ids, each delivered 4 times at once: 50 effects.
func exactlyOnceUnderConcurrency(t *testing.T, newDoor Constructor) {
	env, door := setup(t, newDoor)
	const ids, copies = 50, 4
	var wg sync.WaitGroup
	for c := range copies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range ids {
				id := fmt.Sprintf("m%d", (i+c*7)%ids)
				door.Send(t, id, Body(id, ""))
			}
		}()
	}
	wg.Wait()
	door.Settle(t)
	rows, distinct := effects(t, env)
	require.Equal(t, ids, distinct, "every id applied")
	require.Equal(t, ids, rows, "no id applied twice")
	require.Equal(t, ids, env.DB.Count(t, "{schema}.processed_messages WHERE status = 'done'"))
}

// crashBetweenCommitAndAck: the door commits a transaction and dies before acknowledging
// it; the restarted door gets the messages again and applies each exactly once.
func crashBetweenCommitAndAck(t *testing.T, newDoor Constructor) {
	env, door := setup(t, newDoor)
	door.CrashAfterCommit(t)
	const n = 20
	for i := range n {
		id := fmt.Sprintf("c%d", i)
		door.Send(t, id, Body(id, ""))
	}
	door.Restart(t)
	door.Settle(t)
	rows, distinct := effects(t, env)
	require.Equal(t, n, distinct)
	require.Equal(t, n, rows, "the redelivered messages were deduplicated")
}

// poisonAmongGood: one message fails permanently among good ones: it alone is
// dead-lettered, once, and the door goes on.
func poisonAmongGood(t *testing.T, newDoor Constructor) {
	env, door := setup(t, newDoor)
	for i := range 10 {
		id := fmt.Sprintf("g%d", i)
		door.Send(t, id, Body(id, ""))
		if i == 4 {
			door.Send(t, "poison", Body("poison", `"poison":true`))
		}
	}
	door.Send(t, "after", Body("after", ""))
	door.Settle(t)
	rows, _ := effects(t, env)
	require.Equal(t, 11, rows)
	require.Equal(t, 1, env.DB.Count(t, "{schema}.dead_letters WHERE message_id = 'poison' AND pipeline = $1 AND reason LIKE '%no_poison%'", env.Pipeline))
	require.Equal(t, 1, env.DB.Count(t, "{schema}.processed_messages WHERE message_id = 'poison' AND status = 'dead'"))

	door.Send(t, "poison", Body("poison", `"poison":true`)) // redelivered: not dead-lettered twice
	door.Settle(t)
	require.Equal(t, 1, env.DB.Count(t, "{schema}.dead_letters"))
}

// conflict: the same id with another payload is recorded as a conflict and not applied.
func conflict(t *testing.T, newDoor Constructor) {
	env, door := setup(t, newDoor)
	door.Send(t, "x", Body("x", `"amount":1`))
	door.Settle(t)
	door.Send(t, "x", Body("x", `"amount":2`))
	door.Send(t, "x", Body("x", `"amount":1`)) // a plain retry of the first
	door.Settle(t)
	require.Equal(t, 1, env.DB.Count(t, `{schema}.effects WHERE body->>'amount' = '1'`))
	require.Equal(t, 0, env.DB.Count(t, `{schema}.effects WHERE body->>'amount' = '2'`))
	require.Equal(t, 1, env.DB.Count(t, "{schema}.conflicts WHERE message_id = 'x'"))
}

// replayDeadLetter: a dead letter replayed before its cause is fixed fails and changes
// nothing; once it is fixed, the letter is replayed through its door: applied once, and
// counted once as processed and as replayed; a second replay is refused and counts nothing.
func replayDeadLetter(t *testing.T, newDoor Constructor) {
	env, door := setup(t, newDoor)
	door.Send(t, "poison", Body("poison", `"poison":true`))
	door.Settle(t)
	letters, err := deadletter.New(env.DB.Schema).List(context.Background(), env.DB.Pool, deadletter.Filter{Pipeline: env.Pipeline})
	require.NoError(t, err)
	require.Len(t, letters, 1)

	rp := deadletter.NewReplayer(env.DB.Pool, deadletter.New(env.DB.Schema))
	door.RegisterReplay(t, rp)
	// The pipeline's processed messages, replays, and replays applied.
	counts := func() [3]float64 {
		var c [3]float64
		c[0], _ = metricstest.Sum(t, "idemd_messages_processed_total", map[string]string{"pipeline": env.Pipeline})
		c[1], _ = metricstest.Sum(t, "idemd_dead_letters_replayed_total", map[string]string{"pipeline": env.Pipeline})
		c[2], _ = metricstest.Sum(t, "idemd_dead_letters_replayed_total", map[string]string{"pipeline": env.Pipeline, "outcome": "applied"})
		return c
	}
	before := counts()
	_, err = rp.Replay(context.Background(), letters[0].ID)
	require.ErrorContains(t, err, "no_poison", "the cause is not fixed yet")
	require.Equal(t, before, counts(), "a failed replay counts nothing")

	env.DB.Exec(t, env.DB.Q(`ALTER TABLE {schema}.effects DROP CONSTRAINT no_poison`))
	_, err = rp.Replay(context.Background(), letters[0].ID)
	require.NoError(t, err)
	once := [3]float64{before[0] + 1, before[1] + 1, before[2] + 1}
	require.Equal(t, once, counts(), "processed, replayed, replayed applied: once each")

	_, err = rp.Replay(context.Background(), letters[0].ID)
	require.ErrorIs(t, err, deadletter.ErrAlreadyReplayed)
	require.Equal(t, 1, env.DB.Count(t, "{schema}.effects WHERE message_id = 'poison'"))
	require.Equal(t, once, counts(), "a refused replay counts nothing")
}

package exactlyonce_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/exactlyonce"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/outbox"
)

// TestCommitWithoutAnswer: the connection is cut right after COMMIT was sent. The server
// committed; the unit asks another connection and reports the messages Applied, as they are,
// instead of retrying them into "duplicate" (or failing a request that succeeded).
func TestCommitWithoutAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cut := pgtest.NewCommitCut(t)
	u := newUnit(t, b.db, cut.Pool(t, 4), nil)
	m, api := b.msg("a", 1), b.msg("k", 2)
	m.Answer = nil

	cutDone := cut.Arm(true)
	require.NoError(t, u.Apply(context.Background(), []*exactlyonce.Message{m}))
	<-cutDone
	require.Equal(t, exactlyonce.Applied, m.Outcome)
	require.Equal(t, 1, b.db.Count(t, "{schema}.effects WHERE id = 'a'"))

	// The same for an API request's effect transaction.
	token, err := u.Reserve(context.Background(), api, 0)
	require.NoError(t, err)
	cutDone = cut.Arm(true)
	require.NoError(t, u.ApplyReserved(context.Background(), api, token))
	<-cutDone
	require.Equal(t, exactlyonce.Applied, api.Outcome)
	require.JSONEq(t, `{"id":"k"}`, string(api.Response.Body))
	require.Equal(t, 1, b.db.Count(t, "{schema}.effects WHERE id = 'k'"))
}

// TestCommitNeverSent: the connection is cut instead of sending COMMIT. The server rolls
// back; the unit learns it and retries, so the message is applied once, by the retry.
func TestCommitNeverSent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cut := pgtest.NewCommitCut(t)
	u := newUnit(t, b.db, cut.Pool(t, 4), nil)
	m := b.msg("a", 1)
	m.Answer = nil
	cutDone := cut.Arm(false)
	require.NoError(t, u.Apply(context.Background(), []*exactlyonce.Message{m}))
	<-cutDone
	require.Equal(t, exactlyonce.Applied, m.Outcome)
	require.Equal(t, 1, b.db.Count(t, "{schema}.effects"))
}

// TestCommitInTheLastRoundTripEveryExecMode: a batch whose last statements are queued
// commits in their round trip (sendCommit), whatever the pool's query exec mode (a user
// may set default_query_exec_mode in the database URL, behind PgBouncer say): its effects
// and events are committed, a permanent failure among them still rolls back only its own
// message, and every connection goes back to the pool idle.
func TestCommitInTheLastRoundTripEveryExecMode(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			cfg, err := pgxpool.ParseConfig(pgtest.URL())
			require.NoError(t, err)
			cfg.ConnConfig.DefaultQueryExecMode = mode
			cfg.MaxConns = 2
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			require.NoError(t, err)
			defer pool.Close()
			unit := newUnit(t, b.db, pool, func(c *exactlyonce.Config) { c.OnRetry = func(err error) { t.Log("retry:", err) } })
			ev := func(id string) exactlyonce.Event {
				return exactlyonce.Event{Event: outbox.Event{Topic: "out", Pipeline: "s", CausationID: id, Payload: []byte(`{"p":1}`), OperationID: outbox.OperationID("s", id, 0)}}
			}
			var batch []*exactlyonce.Message
			for i := range 3 {
				m := b.msg(fmt.Sprintf("%s-%d", mode, i), i)
				m.Answer = nil // queued: the batch ends with the COMMIT round trip
				m.Events = []exactlyonce.Event{ev(m.ID)}
				batch = append(batch, m)
			}
			require.NoError(t, unit.Apply(context.Background(), batch))
			for _, m := range batch {
				require.Equal(t, exactlyonce.Applied, m.Outcome, m.ID)
			}
			prefix := mode.String() + "-%"
			require.Equal(t, 3, b.db.Count(t, "{schema}.effects WHERE id LIKE $1", prefix))
			require.Equal(t, 3, b.db.Count(t, "{schema}.outbox WHERE causation_id LIKE $1", prefix))
			require.Equal(t, 3, b.db.Count(t, "{schema}.processed_messages WHERE message_id LIKE $1 AND status = 'done'", prefix))

			// A permanent failure in the last round trip: COMMIT does not run with it; the
			// batch runs again with savepoints and the good message commits alone.
			good, bad := b.msg(mode.String()+"-good", 1), b.msg(mode.String()+"-bad", -1)
			good.Answer, bad.Answer = nil, nil
			good.Events, bad.Events = []exactlyonce.Event{ev(good.ID)}, []exactlyonce.Event{ev(bad.ID)}
			require.NoError(t, unit.Apply(context.Background(), []*exactlyonce.Message{good, bad}))
			require.Equal(t, exactlyonce.Applied, good.Outcome)
			require.Equal(t, exactlyonce.DeadLettered, bad.Outcome)
			require.Equal(t, 1, b.db.Count(t, "{schema}.effects WHERE id = $1", good.ID))
			require.Equal(t, 0, b.db.Count(t, "{schema}.outbox WHERE causation_id = $1", bad.ID))
			require.Equal(t, 1, b.db.Count(t, "{schema}.processed_messages WHERE message_id = $1 AND status = 'dead'", bad.ID))

			// (The relay's NOTIFY after a commit borrows a connection for a moment.)
			require.Eventually(t, func() bool { return pool.Stat().AcquiredConns() == 0 }, 5*time.Second, 10*time.Millisecond,
				"every connection released")
			st := pool.Stat()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			for range st.IdleConns() {
				c, err := pool.Acquire(ctx)
				require.NoError(t, err)
				defer c.Release()
				require.Equal(t, byte('I'), c.Conn().PgConn().TxStatus(), "a released connection is not in a transaction")
			}
		})
	}
}

// roundTrips counts what a pool sends: statements on their own, and batches. The NOTIFY
// that wakes the relay after a commit (outbox.Store.Notify, from a goroutine of its own)
// is not the unit's.
type roundTrips struct{ queries, batches atomic.Int64 }

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, q pgx.TraceQueryStartData) context.Context {
	if !strings.Contains(q.SQL, "pg_notify") {
		r.queries.Add(1)
	}
	return ctx
}
func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.batches.Add(1)
	return ctx
}
func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// TestNewBatchTakesTwoRoundTrips: a batch of new messages whose effects and events are
// queued takes two round trips, BEGIN with the claim and the effects and events with
// COMMIT; a batch of duplicates takes three (the claim, the read-back of the known ids
// between the scans' settings, COMMIT).
func TestNewBatchTakesTwoRoundTrips(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	rt := &roundTrips{}
	cfg.ConnConfig.Tracer = rt
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	defer pool.Close()
	unit := newUnit(t, b.db, pool, nil)
	batch := func() []*exactlyonce.Message {
		var msgs []*exactlyonce.Message
		for i := range 10 {
			m := b.msg(fmt.Sprintf("rt-%d", i), i)
			m.Answer = nil
			m.Events = []exactlyonce.Event{{Event: outbox.Event{Topic: "out", Pipeline: "s", CausationID: m.ID, Payload: []byte(`{}`), OperationID: outbox.OperationID("s", m.ID, 0)}}}
			msgs = append(msgs, m)
		}
		return msgs
	}
	// The first use of a connection prepares its statements: a round trip more per batch.
	require.NoError(t, unit.Apply(context.Background(), batch()[:1]))
	_, err = b.db.Pool.Exec(context.Background(), b.db.Q("TRUNCATE {schema}.effects, {schema}.outbox, {schema}.processed_messages"))
	require.NoError(t, err)

	for _, want := range []struct {
		outcome exactlyonce.Outcome
		batches int64
	}{{exactlyonce.Applied, 2}, {exactlyonce.Duplicate, 3}} {
		rt.queries.Store(0)
		rt.batches.Store(0)
		msgs := batch()
		require.NoError(t, unit.Apply(context.Background(), msgs))
		for _, m := range msgs {
			require.Equal(t, want.outcome, m.Outcome, m.ID)
		}
		require.Zero(t, rt.queries.Load(), "%s: statements sent on their own", want.outcome)
		require.Equal(t, want.batches, rt.batches.Load(), "%s: batches sent", want.outcome)
	}
	require.Equal(t, 10, b.db.Count(t, "{schema}.effects"))
	require.Equal(t, 10, b.db.Count(t, "{schema}.outbox"))
}

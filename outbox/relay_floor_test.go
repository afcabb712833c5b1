package outbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/kafkatest"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/outbox"
)

// lastOutboxID is the id of the outbox row last written.
func (b *relayBundle) lastOutboxID(t *testing.T) int64 {
	t.Helper()
	var id int64
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), b.db.Q(
		`SELECT pg_sequence_last_value(pg_get_serial_sequence('{schema}.outbox', 'id')::regclass)`)).Scan(&id))
	return id
}

// TestRelayFloorWaitsForARunningTransaction: a transaction takes an id and keeps running
// while rows written after it are published and the relay tries to raise its floor
// hundreds of times. The floor stays at or below that id, and once the transaction
// commits, its row is published by a read of the table (it is neither handed over nor
// notified), then the floor passes it.
func TestRelayFloorWaitsForARunningTransaction(t *testing.T) {
	t.Parallel()
	b := setupRelay(t, 1, pgtest.Options{})
	relay, _ := b.startRelay(t, outbox.RelayConfig{})
	b.floorWaitsForALateRow(t, relay)
	records := kafkatest.ReadAll(t, b.topic, 206, 20*time.Second)
	require.Equal(t, "late-0", string(records[len(records)-1].Value))
}

// floorWaitsForALateRow publishes rows until relay's floor passes them, then holds an id
// in a transaction of the test's role while 200 rows after it are published: the floor
// stays at or below it. Once it commits, its row (neither handed over nor notified) is
// published from the table and the floor passes it.
func (b *relayBundle) floorWaitsForALateRow(t *testing.T, relay *outbox.Relay) {
	t.Helper()
	ctx := context.Background()
	b.enqueue(t, b.events(5, "before")...)
	require.Eventually(t, func() bool { return relay.Floor() > b.lastOutboxID(t) }, 10*time.Second, 5*time.Millisecond,
		"with nothing running, the floor passes every row published")

	late, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = late.Rollback(ctx) }()
	var batch pgx.Batch
	_, err = b.store.QueueQuiet(&batch, b.events(1, "late")...)
	require.NoError(t, err)
	require.NoError(t, late.SendBatch(ctx, &batch).Close())
	lateID := b.lastOutboxID(t)
	for i := range 20 {
		b.enqueue(t, b.events(10, "after-"+string(rune('a'+i)))...)
		time.Sleep(10 * time.Millisecond)
	}
	require.Eventually(t, func() bool { return relay.Published() == 205 }, 20*time.Second, 5*time.Millisecond)
	time.Sleep(200 * time.Millisecond) // a few hundred more steps at FloorInterval 1 ms
	require.LessOrEqual(t, relay.Floor(), lateID, "the floor never passes a transaction still running")

	require.NoError(t, late.Commit(ctx))
	require.Eventually(t, func() bool { return relay.Published() == 206 }, 10*time.Second, 5*time.Millisecond,
		"the late row is read from the table (the poll)")
	require.Eventually(t, func() bool { return relay.Floor() > lateID }, 10*time.Second, 5*time.Millisecond)
}

// TestRelayFloorStaysBelowAHeldDestination: rows of a destination that waits for its retry
// (a Pub/Sub topic with no client here) stay in the outbox while later rows are
// published; the floor stops at the first of them, and never passes rows still to publish.
func TestRelayFloorStaysBelowAHeldDestination(t *testing.T) {
	t.Parallel()
	b := setupRelay(t, 1, pgtest.Options{})
	relay, _ := b.startRelay(t, outbox.RelayConfig{})
	b.enqueue(t, b.events(3, "first")...)
	b.enqueue(t, outbox.Event{Topic: outbox.PubSubDestination("nowhere"), Payload: []byte("held"), Pipeline: "p", CausationID: "held"})
	held := b.lastOutboxID(t)
	b.enqueue(t, b.events(3, "then")...)
	require.Eventually(t, func() bool { return relay.Published() == 6 }, 20*time.Second, 5*time.Millisecond)
	require.Eventually(t, func() bool { return relay.Floor() == held }, 10*time.Second, 5*time.Millisecond,
		"the floor is the held row's id")
	time.Sleep(100 * time.Millisecond)
	require.Equal(t, held, relay.Floor())
	require.Equal(t, 1, b.db.Count(t, "{schema}.outbox WHERE published_at IS NULL"))
}

// TestRelayFloorAfterIdentityRestart: the outbox is emptied with its identity restarted
// while the relay leads with a floor well above 1. The rows written next, with ids from 1,
// are published within a second: the relay sees the ids go back and starts from the bottom.
func TestRelayFloorAfterIdentityRestart(t *testing.T) {
	t.Parallel()
	b := setupRelay(t, 1, pgtest.Options{})
	relay, _ := b.startRelay(t, outbox.RelayConfig{})
	b.enqueue(t, b.events(50, "before")...)
	b.drain(t, relay, 20*time.Second)
	require.Eventually(t, func() bool { return relay.Floor() > 50 }, 10*time.Second, 5*time.Millisecond)

	b.db.Exec(t, b.db.Q(`TRUNCATE {schema}.outbox RESTART IDENTITY`))
	b.enqueue(t, b.events(3, "after")...)
	require.Equal(t, int64(3), b.lastOutboxID(t))
	// Well within the 256 fences after which a fence looks from the bottom anyway.
	require.Eventually(t, func() bool { return relay.Published() == 53 }, 2*time.Second, 5*time.Millisecond)
	records := kafkatest.ReadAll(t, b.topic, 53, 20*time.Second)
	require.Equal(t, "after-2", string(records[len(records)-1].Value))
}

// limitedPool returns a pool whose sessions act as a role of their own (SET ROLE), which
// may read and write idemd's tables, and use the outbox's identity when identity, but is
// neither superuser nor a member of pg_read_all_stats: it sees other roles' sessions
// without their backend_type.
func (b *relayBundle) limitedPool(t *testing.T, identity bool) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	role := "idemd_floor_" + strings.ToLower(strings.ReplaceAll(b.db.Schema, "-", "_"))
	if identity {
		role += "_seq"
	}
	q := pgx.Identifier{role}.Sanitize()
	schema := pgx.Identifier{b.db.Schema}.Sanitize()
	b.db.Exec(t, `CREATE ROLE `+q+` NOLOGIN`)
	b.db.Exec(t, `GRANT USAGE ON SCHEMA `+schema+` TO `+q)
	b.db.Exec(t, `GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA `+schema+` TO `+q)
	if identity {
		b.db.Exec(t, `GRANT USAGE ON ALL SEQUENCES IN SCHEMA `+schema+` TO `+q)
	}
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	cfg.MaxConns = 4
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, `SET ROLE `+q)
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		pool.Close()
		b.db.Exec(t, `DROP OWNED BY `+q)
		b.db.Exec(t, `DROP ROLE `+q)
	})
	return pool
}

// TestRelayFloorWithoutTheIdentity: a role that may write and delete outbox rows but not
// read the identity's sequence. The relay publishes as it did before the floor, reading
// from the bottom, and says so once.
func TestRelayFloorWithoutTheIdentity(t *testing.T) {
	t.Parallel()
	b := setupRelay(t, 1, pgtest.Options{})
	logger := logrus.New()
	hook := logtest.NewLocal(logger)
	relay := b.runRelay(t, b.limitedPool(t, false), logrus.NewEntry(logger))

	b.enqueue(t, b.events(5, "no-identity")...)
	require.Eventually(t, func() bool { return relay.Published() == 5 }, 20*time.Second, 5*time.Millisecond)
	time.Sleep(100 * time.Millisecond)
	require.Zero(t, relay.Floor())
	said := 0
	for _, e := range hook.AllEntries() {
		if strings.Contains(e.Message, "may not read the outbox's identity") {
			said++
		}
	}
	require.Equal(t, 1, said, "said once")
}

// TestRelayFloorPassesOtherDatabases: a transaction left open in another database of the
// server, which cannot write this outbox, does not hold the floor back.
func TestRelayFloorPassesOtherDatabases(t *testing.T) {
	t.Parallel()
	b := setupRelay(t, 1, pgtest.Options{})
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	cfg.Database = "postgres"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer conn.Close(ctx)
	other, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = other.Rollback(ctx) }()
	_, err = other.Exec(ctx, `SELECT pg_current_xact_id()`)
	require.NoError(t, err)

	relay, _ := b.startRelay(t, outbox.RelayConfig{})
	b.enqueue(t, b.events(5, "beside")...)
	b.drain(t, relay, 20*time.Second)
	require.Eventually(t, func() bool { return relay.Floor() > b.lastOutboxID(t) }, 10*time.Second, 5*time.Millisecond,
		"the floor passes the rows published while another database's transaction runs")
}

// TestRelayFloorAsALimitedRole: the relay's role sees the writer's session (another
// role's) without its backend_type. The writer's running transaction still holds the
// floor below its id, and its row is published once it commits.
func TestRelayFloorAsALimitedRole(t *testing.T) {
	t.Parallel()
	b := setupRelay(t, 1, pgtest.Options{})
	relay := b.runRelay(t, b.limitedPool(t, true), quietLogger())
	b.floorWaitsForALateRow(t, relay)
}

// runRelay runs a relay on pool until the test ends, its floor raised every millisecond.
func (b *relayBundle) runRelay(t *testing.T, pool *pgxpool.Pool, log *logrus.Entry) *outbox.Relay {
	t.Helper()
	relay, err := outbox.NewRelay(pool, &outbox.RelayConfig{Schema: b.db.Schema, Brokers: kafkatest.Brokers(t),
		FloorInterval: time.Millisecond, PollInterval: 50 * time.Millisecond, Logger: log})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return relay
}

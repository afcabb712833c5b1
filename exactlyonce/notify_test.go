package exactlyonce_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/exactlyonce"
	"github.com/idemd/idemd/internal/kafkatest"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/outbox"
)

// The unit does not NOTIFY inside its transactions (that would serialize their commits):
// it wakes the relay after each commit that wrote outbox rows, on the fast path and on the
// careful one (savepoints), and after an API request's ApplyReserved.
func TestCommitWakesTheRelay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pgtest.URL())
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{outbox.Channel(b.db.Schema)}.Sanitize())
	require.NoError(t, err)

	event := func(id string) []exactlyonce.Event {
		return []exactlyonce.Event{{Event: outbox.Event{Topic: "t", Pipeline: "s", CausationID: id, Payload: []byte("{}")}}}
	}
	woken := func(what string) {
		t.Helper()
		n, err := conn.WaitForNotification(ctx)
		require.NoError(t, err, what)
		require.Equal(t, outbox.Channel(b.db.Schema), n.Channel, what)
		// Notifications of one commit may be folded into one; drain what else came.
		for {
			dctx, dcancel := context.WithTimeout(ctx, 50*time.Millisecond)
			_, err := conn.WaitForNotification(dctx)
			dcancel()
			if err != nil {
				return
			}
		}
	}

	fast := b.msg("fast", 1)
	fast.Answer, fast.Events = nil, event("fast")
	require.NoError(t, b.unit.Apply(ctx, []*exactlyonce.Message{fast}))
	require.Equal(t, exactlyonce.Applied, fast.Outcome)
	woken("fast path")

	// A poison message sends the batch down the careful path.
	good, poison := b.msg("good", 1), b.msg("poison", -1)
	good.Answer, good.Events = nil, event("good")
	poison.Answer = nil
	require.NoError(t, b.unit.Apply(ctx, []*exactlyonce.Message{good, poison}))
	require.Equal(t, exactlyonce.Applied, good.Outcome)
	require.Equal(t, exactlyonce.DeadLettered, poison.Outcome)
	woken("careful path")

	api := b.msg("api", 1)
	api.Events = event("api")
	token, err := b.unit.Reserve(ctx, api, 0)
	require.NoError(t, err)
	require.NoError(t, b.unit.ApplyReserved(ctx, api, token))
	require.Equal(t, exactlyonce.Applied, api.Outcome)
	woken("ApplyReserved")

	require.Equal(t, 3, b.db.Count(t, "{schema}.outbox"))

	// HTTP-only events wake the deliverers, on their own channel.
	_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{outbox.DeliveryChannel(b.db.Schema)}.Sanitize())
	require.NoError(t, err)
	sink := b.msg("sink", 1)
	sink.Answer = nil
	sink.Events = []exactlyonce.Event{{Event: outbox.Event{Endpoint: "erp", Pipeline: "s", CausationID: "sink", Payload: []byte("{}")}}}
	require.NoError(t, b.unit.Apply(ctx, []*exactlyonce.Message{sink}))
	n, err := conn.WaitForNotification(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.DeliveryChannel(b.db.Schema), n.Channel)
	require.Equal(t, 1, b.db.Count(t, "{schema}.http_deliveries"))
}

// With a Handoff whose relay leads, a commit hands its outbox rows to that relay instead of
// sending a NOTIFY, and the relay publishes them; once the relay stopped, a commit wakes the
// relay with a NOTIFY again, wherever it leads.
func TestCommitHandsRowsToTheRelayOfItsProcess(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	db.Exec(t, db.Q("CREATE TABLE {schema}.effects (id text PRIMARY KEY, n int NOT NULL CHECK (n >= 0))"))
	h := outbox.NewHandoff()
	b := &bundle{db: db, unit: newUnit(t, db, db.Pool, func(c *exactlyonce.Config) { c.Handoff = h })}
	topic := kafkatest.Topic(t, 1)
	l := logrus.New()
	l.SetLevel(logrus.ErrorLevel)
	relay, err := outbox.NewRelay(db.Pool, &outbox.RelayConfig{Schema: db.Schema, Brokers: kafkatest.Brokers(t), Handoff: h,
		PollInterval: time.Minute, Logger: logrus.NewEntry(l)})
	require.NoError(t, err)
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	t.Cleanup(func() { stop(); <-done })

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, relay.Drain(ctx), "the relay leads and has read the table")
	conn, err := pgx.Connect(ctx, pgtest.URL())
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{outbox.Channel(db.Schema)}.Sanitize())
	require.NoError(t, err)

	m := b.msg("handed", 1)
	m.Answer, m.Events = nil, []exactlyonce.Event{{Event: outbox.Event{Topic: topic, Pipeline: "s", CausationID: "handed", Payload: []byte(`{"a":1}`)}}}
	require.NoError(t, b.unit.Apply(ctx, []*exactlyonce.Message{m}))
	records := kafkatest.ReadAll(t, topic, 1, 20*time.Second)
	require.Len(t, records, 1)
	require.Equal(t, `{"a":1}`, string(records[0].Value))
	// The record reaches Kafka before the relay commits its round and counts it.
	require.Eventually(t, func() bool { return relay.HandedRounds() == 1 }, 10*time.Second, time.Millisecond,
		"the relay took the row from the Handoff")
	wctx, wcancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = conn.WaitForNotification(wctx)
	wcancel()
	require.Error(t, err, "no NOTIFY for rows handed over")

	stop()
	require.NoError(t, <-done)
	done <- nil // for the cleanup
	m = b.msg("notified", 1)
	m.Answer, m.Events = nil, []exactlyonce.Event{{Event: outbox.Event{Topic: topic, Pipeline: "s", CausationID: "notified", Payload: []byte("{}")}}}
	require.NoError(t, b.unit.Apply(ctx, []*exactlyonce.Message{m}))
	n, err := conn.WaitForNotification(ctx)
	require.NoError(t, err, "no relay of the process leads: the commit notifies")
	require.Equal(t, outbox.Channel(db.Schema), n.Channel)
}

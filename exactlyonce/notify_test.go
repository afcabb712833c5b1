package exactlyonce_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/exactlyonce"
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

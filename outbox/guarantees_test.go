package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/internal/kafkatest"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/outbox"
)

// TestHandoffKeepsTheRowsOfAFailingDestination: rows handed over to the relay (Handoff)
// are deleted in the transaction that publishes them, which commits only once every broker
// acknowledged them. A handed round with a row for a topic that does not exist publishes
// the other rows and keeps that one in the outbox, for its destination's retry. The handed
// rounds of the other tests all succeeded, so a relay that committed a handed round whose
// publish failed, losing the failed rows, passed before.
func TestHandoffKeepsTheRowsOfAFailingDestination(t *testing.T) {
	t.Parallel()
	b := setupHandoff(t, 1, pgtest.Options{})
	missing := kafkatest.Name(t, "missing")
	relay, _ := b.relayBundle.startRelay(t, outbox.RelayConfig{Handoff: b.handoff, PollInterval: time.Minute, MaxFailingFor: time.Hour},
		func(s *outbox.RelaySignals) { s.Round.Init(t) })
	relay.TestSignals().Leading.Wait(t)
	require.NoError(t, relay.Drain(context.Background())) // caught up: it takes handed rows from now on

	require.True(t, b.write(t,
		outbox.Event{Topic: missing, Key: []byte("k"), Payload: []byte("held"), Pipeline: "p", CausationID: "m1"},
		outbox.Event{Topic: b.topic, Key: []byte("k"), Payload: []byte("published"), Pipeline: "p", CausationID: "m1"},
	), "the rows were handed over")
	rd := relay.TestSignals().Round.WaitFor(t, "the handed round", func(rd outbox.RelayRound) bool { return rd.Published > 0 })
	require.Equal(t, 1, rd.Published, "the row of the topic that exists")
	require.Equal(t, []string{missing}, rd.Failed)
	require.Equal(t, 1, b.db.Count(t, "{schema}.outbox WHERE topic = $1 AND published_at IS NULL", missing),
		"the row its broker did not acknowledge stays in the outbox")
	require.Zero(t, b.db.Count(t, "{schema}.dead_letters"))
	require.Equal(t, []string{"published"}, payloads(kafkatest.ReadAll(t, b.topic, 1, 20*time.Second)))

	// Once the topic exists, the row kept is published, with its operation id.
	kafkatest.CreateTopic(t, missing, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, relay.Drain(ctx))
	require.Zero(t, b.db.Count(t, "{schema}.outbox"))
	records := kafkatest.ReadAll(t, missing, 1, 20*time.Second)
	require.Equal(t, []string{"held"}, payloads(records))
	require.Equal(t, outbox.OperationID("p", "m1", 0).String(), kafkatest.Header(records[0], outbox.HeaderOperationID))
}

// TestRelayBacksOffAFailingDestination: a destination whose publish failed is left out of
// the rounds until its retry (RelayConfig.BackoffMin, BackoffMax), while the other
// destinations' rows go on: here the retry is hours away, and the rounds that publish the
// good topic's rows hold the missing topic's without trying it. No other test had a backoff
// long enough to tell, so a relay that retried a failing destination in every round,
// hammering its broker, passed before.
func TestRelayBacksOffAFailingDestination(t *testing.T) {
	t.Parallel()
	b := setupRelay(t, 1, pgtest.Options{})
	missing := kafkatest.Name(t, "missing")
	b.enqueue(t, outbox.Event{Topic: missing, Key: []byte("k"), Payload: []byte("held"), Pipeline: "p", CausationID: "held"})
	relay, _ := b.startRelay(t, outbox.RelayConfig{BackoffMin: 1000 * time.Hour, BackoffMax: 1000 * time.Hour, MaxFailingFor: -1},
		func(s *outbox.RelaySignals) { s.Round.Init(t) })
	relay.TestSignals().Round.WaitFor(t, "the missing topic's first failure", func(rd outbox.RelayRound) bool {
		return len(rd.Failed) == 1 && rd.Failed[0] == missing
	})
	// Every round until the next one that publishes: none of them tries the missing topic.
	published := func() {
		t.Helper()
		rd := relay.TestSignals().Round.WaitFor(t, "a round of the good topic", func(rd outbox.RelayRound) bool {
			require.Empty(t, rd.Failed, "the failing topic was tried again before its retry")
			return rd.Published > 0
		})
		require.Equal(t, []string{missing}, rd.Held)
	}
	for i := range 3 {
		b.enqueue(t, b.events(5, fmt.Sprintf("good-%d", i))...)
		published()
	}
	// A row written without a NOTIFY waits for the relay's next poll (200 ms here): the
	// rounds before it, if any, are the failing topic's retries.
	b.db.Exec(t, b.db.Q(`INSERT INTO {schema}.outbox (operation_id, pipeline, causation_id, topic, key, payload)
VALUES (gen_random_uuid(), 'p', 'quiet', $1, 'k', 'quiet')`), b.topic)
	published()
	require.Equal(t, 1, b.db.Count(t, "{schema}.outbox WHERE topic = $1", missing), "its row waits")
}

// TestReplayedLetterKeepsItsKey: a row dead-lettered because its topic kept failing is put
// back by a replay with everything the relay needs to publish it as it would have: its
// topic, its operation id, its headers and its key, so that the record goes to its key's
// partition, in its key's order. The replay tests checked the topic and the operation id
// only, so a replay that dropped the key, sending the record to any partition, passed
// before.
func TestReplayedLetterKeepsItsKey(t *testing.T) {
	t.Parallel()
	b := setupRelay(t, 1, pgtest.Options{})
	missing := kafkatest.Name(t, "missing")
	b.enqueue(t, outbox.Event{Topic: missing, Key: []byte("order-7"), Payload: []byte(`{"n":1}`), Pipeline: "p", CausationID: "m1",
		Headers: map[string]string{outbox.HeaderEventType: "order.paid"}})
	relay, stop := b.startRelay(t, outbox.RelayConfig{MaxFailingFor: time.Millisecond, BackoffMin: time.Millisecond, BackoffMax: 10 * time.Millisecond})
	b.drain(t, relay, 30*time.Second)
	require.NoError(t, stop())
	letters, err := deadletter.New(b.db.Schema).List(context.Background(), b.db.Pool, deadletter.Filter{})
	require.NoError(t, err)
	require.Len(t, letters, 1, "the row of the missing topic was dead-lettered")

	rp := deadletter.NewReplayer(b.db.Pool, deadletter.New(b.db.Schema))
	b.store.RegisterReplay(rp)
	_, err = rp.Replay(context.Background(), letters[0].ID)
	require.NoError(t, err)
	var (
		topic, op, eventType string
		key                  []byte
	)
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), b.db.Q(`SELECT topic, operation_id::text, key, headers->>'event-type' FROM {schema}.outbox`)).
		Scan(&topic, &op, &key, &eventType))
	require.Equal(t, missing, topic)
	require.Equal(t, outbox.OperationID("p", "m1", 0).String(), op)
	require.Equal(t, "order-7", string(key), "the replayed row keeps its key")
	require.Equal(t, "order.paid", eventType)

	// Once the topic exists, the record is the one the row would have made.
	kafkatest.CreateTopic(t, missing, 1)
	relay, _ = b.startRelay(t, outbox.RelayConfig{})
	b.drain(t, relay, 30*time.Second)
	records := kafkatest.ReadAll(t, missing, 1, 20*time.Second)
	require.Len(t, records, 1)
	require.Equal(t, "order-7", string(records[0].Key))
	require.Equal(t, outbox.OperationID("p", "m1", 0).String(), kafkatest.Header(records[0], outbox.HeaderOperationID))
	require.Equal(t, "order.paid", kafkatest.Header(records[0], outbox.HeaderEventType))
}

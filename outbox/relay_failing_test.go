package outbox_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/internal/kafkatest"
	"github.com/idemd/idemd/internal/metrics"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/outbox"
)

// keyed returns n events of topic over keys k0..k(keys-1), payload "<prefix>:<key>:<seq>"
// with seq counting per key, so that a reader can check each key's order.
func keyed(topic, prefix string, n, keys int) []outbox.Event {
	out := make([]outbox.Event, n)
	for i := range out {
		k := fmt.Sprintf("k%d", i%keys)
		out[i] = outbox.Event{Topic: topic, Key: []byte(k), Payload: fmt.Appendf(nil, "%s:%s:%04d", prefix, k, i/keys),
			Pipeline: "p", CausationID: fmt.Sprintf("%s-%d", prefix, i)}
	}
	return out
}

// interleave alternates the events of a and b: a failing topic's rows come first and are
// spread among the good ones, as a stuck head would be.
func interleave(a, b []outbox.Event) []outbox.Event {
	var out []outbox.Event
	for i := range max(len(a), len(b)) {
		if i < len(a) {
			out = append(out, a[i])
		}
		if i < len(b) {
			out = append(out, b[i])
		}
	}
	return out
}

// requireKeyOrder checks that records carry each key's payloads in sequence, once each.
func requireKeyOrder(t *testing.T, records []kafka.Message, want int) {
	t.Helper()
	seen := map[string]bool{}
	last := map[string]int{}
	for _, m := range records {
		p := string(m.Value)
		if seen[p] {
			continue // an at-least-once repeat
		}
		seen[p] = true
		parts := strings.Split(p, ":")
		require.Len(t, parts, 3, p)
		seq, err := strconv.Atoi(parts[2])
		require.NoError(t, err)
		if prev, ok := last[parts[1]]; ok {
			require.Equal(t, prev+1, seq, "key %s out of order", parts[1])
		}
		last[parts[1]] = seq
	}
	require.Len(t, seen, want)
}

// TestRelayIsolatesAMissingTopic: the outbox holds rows for a topic that does not exist (the
// relay never asks the broker to create topics) ahead of and among rows of a good topic.
// The good topic's rows are all published, in per-key order, while the missing topic's rows
// wait, none lost nor dead-lettered (MaxFailingFor has not passed), the topic counted as
// failing. Once the topic exists, its rows are published in order too.
func TestRelayIsolatesAMissingTopic(t *testing.T) {
	t.Parallel()
	b := setupRelay(t, 3, pgtest.Options{})
	missing := kafkatest.Name(t, "missing")
	good := keyed(b.topic, "good", 300, 5)
	held := keyed(missing, "held", 60, 3)
	b.enqueue(t, interleave(held, good)...)

	errorsBefore := testutil.ToFloat64(metrics.OutboxPublishErrors.WithLabelValues(missing))
	relay, _ := b.startRelay(t, outbox.RelayConfig{BatchSize: 50, BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond, MaxFailingFor: time.Hour},
		func(s *outbox.RelaySignals) { s.Round.Init(t) })

	// Without isolation every round fails on the missing topic and nothing is published.
	records := kafkatest.ReadAll(t, b.topic, len(good), 30*time.Second)
	requireKeyOrder(t, records, len(good))
	relay.TestSignals().Round.WaitFor(t, "a failed round of the missing topic", func(rd outbox.RelayRound) bool {
		return len(rd.Failed) == 1 && rd.Failed[0] == missing
	})
	require.Equal(t, len(held), b.db.Count(t, "{schema}.outbox WHERE topic = $1 AND published_at IS NULL", missing), "the missing topic's rows wait")
	require.Zero(t, b.db.Count(t, "{schema}.outbox WHERE topic = $1 AND published_at IS NULL", b.topic))
	require.Zero(t, b.db.Count(t, "{schema}.dead_letters"))
	require.EqualValues(t, 1, testutil.ToFloat64(metrics.OutboxTopicFailing.WithLabelValues(missing)))
	require.Greater(t, testutil.ToFloat64(metrics.OutboxPublishErrors.WithLabelValues(missing)), errorsBefore)

	// Drain cannot finish while rows wait behind a failing topic: it gives up with ctx.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, relay.Drain(ctx), context.DeadlineExceeded)

	kafkatest.CreateTopic(t, missing, 2)
	b.drain(t, relay, 30*time.Second)
	requireKeyOrder(t, kafkatest.ReadAll(t, missing, len(held), 30*time.Second), len(held))
	require.Zero(t, testutil.ToFloat64(metrics.OutboxTopicFailing.WithLabelValues(missing)))
}

// TestRelayDeadLettersATopicItMayNotWrite: the broker refuses every produce to one topic
// (TOPIC_AUTHORIZATION_FAILED, as a missing ACL does). The other topic's rows are published
// in per-key order; once the topic has failed for MaxFailingFor, its rows are moved to
// dead_letters, each with its operation id and key so that `dlq replay` can put it back.
func TestRelayDeadLettersATopicItMayNotWrite(t *testing.T) {
	t.Parallel()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	require.NoError(t, err)
	t.Cleanup(cluster.Close)
	brokers := cluster.ListenAddrs()
	db := pgtest.New(t)
	b := &relayBundle{db: db, store: outbox.New(&outbox.Config{Schema: db.Schema}), topic: kafkatest.Name(t, "good")}
	denied := kafkatest.Name(t, "denied")
	kafkatest.CreateTopicOn(t, brokers, b.topic, 3)
	kafkatest.CreateTopicOn(t, brokers, denied, 3)
	cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: denied, Err: kerr.TopicAuthorizationFailed, Count: -1})

	good := keyed(b.topic, "good", 200, 4)
	refused := keyed(denied, "refused", 40, 2)
	all := interleave(refused, good)
	b.enqueue(t, all...)
	ordinal := map[string]int{} // causation id -> index in the EnqueueTx call
	for i, ev := range all {
		ordinal[ev.CausationID] = i
	}
	relay, _ := b.startRelay(t, outbox.RelayConfig{Brokers: brokers, BatchSize: 40,
		BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond, MaxFailingFor: 300 * time.Millisecond})

	b.drain(t, relay, 30*time.Second)
	requireKeyOrder(t, kafkatest.ReadAllFrom(t, brokers, b.topic, len(good), 30*time.Second), len(good))
	require.Zero(t, b.db.Count(t, "{schema}.outbox WHERE topic = $1", denied), "the refused rows left the outbox")

	letters, err := deadletter.New(db.Schema).List(context.Background(), db.Pool, deadletter.Filter{Limit: 1000})
	require.NoError(t, err)
	require.Len(t, letters, len(refused), "every refused row is dead-lettered, none lost")
	for i, l := range letters {
		ev := refused[i] // letters are listed in id order: the rows' order
		require.Equal(t, "kafka:"+denied, l.Scope)
		require.Equal(t, deadletter.DoorRelay, l.Origin.Door)
		require.Equal(t, outbox.OperationID("p", ev.CausationID, ordinal[ev.CausationID]), l.Origin.OperationID, "replay keeps the operation id")
		require.NotZero(t, l.Origin.OutboxID)
		require.Equal(t, ev.CausationID, l.MessageID)
		require.Equal(t, string(ev.Payload), string(l.Payload))
		require.Equal(t, denied, l.Metadata["topic"])
		require.Equal(t, string(ev.Key), l.Metadata["key"])
		require.Equal(t, outbox.OperationID("p", ev.CausationID, ordinal[ev.CausationID]).String(), l.Metadata["operation_id"], "replay keeps the operation id")
		require.Contains(t, l.Reason, "TOPIC_AUTHORIZATION_FAILED")
		require.Contains(t, l.Reason, "MaxFailingFor")
	}
}

package consumer

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pubsubtest"
)

func newTestPubSubSource(t *testing.T, cfg pubsubSourceConfig) *pubsubSource {
	t.Helper()
	s, err := newPubSubSource(pubsubtest.Client(t), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestPubSubSourceAckAfterExplicitCall: received messages carry id, body, attributes and
// lane; Pub/Sub records no ack until Ack; a released message comes back with the same id,
// an acknowledged one does not.
func TestPubSubSourceAckAfterExplicitCall(t *testing.T) {
	t.Parallel()
	fake := pubsubtest.Fake(t)
	topic := pubsubtest.Topic(t)
	sub := pubsubtest.Subscription(t, topic, pubsubtest.SubscriptionConfig{})
	ids := pubsubtest.Publish(t, topic,
		pubsubtest.Message{Data: `{"id":"a"}`, Attributes: map[string]string{"operation-id": "op-a"}},
		pubsubtest.Message{Data: `{"id":"b"}`})
	s := newTestPubSubSource(t, pubsubSourceConfig{Subscription: sub})

	ackRelease(t, s, ids, func() {
		require.Zero(t, fake.Message(ids[0]).Acks, "nothing is acknowledged before Ack")
	})
	require.NoError(t, s.Close())
	require.Equal(t, 1, fake.Message(ids[0]).Acks)
	require.Equal(t, 1, fake.Message(ids[1]).Acks)
	require.Equal(t, 2, fake.Message(ids[1]).Deliveries)
}

// TestPubSubSourceLeaseExtension: a message held past its ack deadline is not redelivered,
// because the client extends its lease, while its copy on a subscription nobody extends
// comes back. (Slow: the client extends by at least 6 s.)
func TestPubSubSourceLeaseExtension(t *testing.T) {
	t.Parallel()
	pubsubtest.Fake(t) // reads nothing from it, but the emulator takes deadlines of 10 s or more
	topic := pubsubtest.Topic(t)
	sub := pubsubtest.Subscription(t, topic, pubsubtest.SubscriptionConfig{AckDeadline: time.Second})
	control := pubsubtest.Subscription(t, topic, pubsubtest.SubscriptionConfig{AckDeadline: 9 * time.Second})
	id := pubsubtest.Publish(t, topic, pubsubtest.Message{Data: "held"})[0]
	// Unextended, the lease would end 6 s after receipt.
	s := newTestPubSubSource(t, pubsubSourceConfig{Subscription: sub, ExtensionPeriod: 6 * time.Second})
	held := receiveN(t, s, 1)
	require.Equal(t, id, held[0].ID)

	// The control copy comes a second time once its 9 s deadline passed.
	pubsubtest.PullUntil(t, control, 30*time.Second, func(got []*pubsubpb.ReceivedMessage) bool { return len(got) >= 2 })
	requireNothing(t, s, 200*time.Millisecond)
	require.NoError(t, s.Ack(context.Background(), held))
}

// TestPubSubSourceOrderingKeys: on an ordered subscription, each key's messages come in
// publish order, marked Ordered with the key as lane.
func TestPubSubSourceOrderingKeys(t *testing.T) {
	t.Parallel()
	topic := pubsubtest.Topic(t)
	sub := pubsubtest.Subscription(t, topic, pubsubtest.SubscriptionConfig{Ordered: true})
	var msgs []pubsubtest.Message
	for i := range 5 {
		for _, k := range []string{"k1", "k2"} {
			msgs = append(msgs, pubsubtest.Message{Data: fmt.Sprintf("%s-%d", k, i), OrderingKey: k})
		}
	}
	pubsubtest.Publish(t, topic, msgs...)
	s := newTestPubSubSource(t, pubsubSourceConfig{Subscription: sub})

	lanes := map[string][]string{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for n := 0; n < len(msgs); {
		got, err := s.Receive(ctx)
		require.NoError(t, err)
		for _, m := range got {
			require.True(t, m.Ordered)
			lanes[m.Lane] = append(lanes[m.Lane], string(m.Body))
		}
		// pstest delivers a key's next message once the previous one is acknowledged.
		require.NoError(t, s.Ack(ctx, got))
		n += len(got)
	}
	require.Equal(t, []string{"k1-0", "k1-1", "k1-2", "k1-3", "k1-4"}, lanes["k1"])
	require.Equal(t, []string{"k2-0", "k2-1", "k2-2", "k2-3", "k2-4"}, lanes["k2"])
}

// TestPubSubSourceCloseReleases: what the source holds at Close is nacked (a modack to 0 s
// reaches the server) and never acked, so that the broker redelivers it at once rather than
// after its 60 s deadline; a missing subscription fails Receive.
//
// The redelivery itself is pstest's to do and is not asserted here: the client sends its
// last nacks while its streams are still open, and pstest may hand the message out again on
// a closing stream, which the client then drops; that copy comes back after its ack
// deadline (docs/brokers.md). Nothing is lost either way.
func TestPubSubSourceCloseReleases(t *testing.T) {
	t.Parallel()
	fake := pubsubtest.Fake(t)
	topic := pubsubtest.Topic(t)
	sub := pubsubtest.Subscription(t, topic, pubsubtest.SubscriptionConfig{AckDeadline: 60 * time.Second})
	id := pubsubtest.Publish(t, topic, pubsubtest.Message{Data: "x"})[0]
	s := newTestPubSubSource(t, pubsubSourceConfig{Subscription: sub})
	receiveN(t, s, 1)
	require.NoError(t, s.Close())
	require.NoError(t, s.Close(), "Close is safe twice")
	m := fake.Message(id)
	require.Zero(t, m.Acks)
	require.True(t, slices.ContainsFunc(m.Modacks, func(x pstest.Modack) bool { return x.AckDeadline == 0 }),
		"Close nacked the held message (a modack to 0 s): %+v", m.Modacks)

	missing := newTestPubSubSource(t, pubsubSourceConfig{Subscription: pubsubtest.SubscriptionName(pubsubtest.Name(t))})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := missing.Receive(ctx)
	require.ErrorContains(t, err, "NotFound")
}

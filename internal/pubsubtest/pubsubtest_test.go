package pubsubtest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/stretchr/testify/require"
)

// receive runs the client's streaming Receive on sub until stop returns true for a message
// seen, calling handle for each (which acks or nacks it), then cancels and waits for Receive
// to return (which flushes the acks).
func receive(t *testing.T, sub string, handle func(*pubsub.Message) (stop bool)) {
	t.Helper()
	s := Client(t).Subscriber(sub)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var mu sync.Mutex
	err := s.Receive(ctx, func(_ context.Context, m *pubsub.Message) {
		mu.Lock()
		defer mu.Unlock()
		if handle(m) {
			cancel()
		}
	})
	require.NoError(t, err)
	require.ErrorIs(t, ctx.Err(), context.Canceled, "Receive ended before the awaited messages came")
}

// TestPublishReceiveAck: the official client publishes with attributes, receives them through
// the streaming pull and acknowledges them; the fake records one delivery and one ack each.
func TestPublishReceiveAck(t *testing.T) {
	t.Parallel()
	topic := Topic(t)
	sub := Subscription(t, topic, SubscriptionConfig{})
	ids := Publish(t, topic,
		Message{Data: "a", Attributes: map[string]string{"operation-id": "op-a"}},
		Message{Data: "b", Attributes: map[string]string{"operation-id": "op-b"}},
		Message{Data: "c"})

	got := map[string]*pubsub.Message{}
	receive(t, sub, func(m *pubsub.Message) bool {
		m.Ack()
		got[m.ID] = m
		return len(got) == len(ids)
	})
	require.Equal(t, "a", string(got[ids[0]].Data))
	require.Equal(t, "op-a", got[ids[0]].Attributes["operation-id"])
	require.Equal(t, "op-b", got[ids[1]].Attributes["operation-id"])

	fake := Fake(t)
	for _, id := range ids {
		m := fake.Message(id)
		require.Equal(t, 1, m.Deliveries, "message %s", id)
		require.Equal(t, 1, m.Acks, "message %s", id)
	}
}

// TestNackRedelivers: a nacked message comes back with the same message id; an acked one
// does not.
func TestNackRedelivers(t *testing.T) {
	t.Parallel()
	topic := Topic(t)
	sub := Subscription(t, topic, SubscriptionConfig{})
	id := Publish(t, topic, Message{Data: "x"})[0]

	deliveries := 0
	receive(t, sub, func(m *pubsub.Message) bool {
		require.Equal(t, id, m.ID)
		deliveries++
		if deliveries == 1 {
			m.Nack()
			return false
		}
		m.Ack()
		return true
	})
	require.Equal(t, 2, deliveries)
	if Addr(t); fake != nil {
		require.Equal(t, 1, fake.Message(id).Acks)
	}
}

// TestAckDeadlineExtension: of two messages pulled with a 1 s ack deadline, the one whose
// deadline was extended (ModifyAckDeadline) is not redelivered when the other one is.
func TestAckDeadlineExtension(t *testing.T) {
	t.Parallel()
	Fake(t) // a 1 s ack deadline is below the emulator's minimum
	topic := Topic(t)
	sub := Subscription(t, topic, SubscriptionConfig{AckDeadline: time.Second})
	ids := Publish(t, topic, Message{Data: "extended"}, Message{Data: "expires"})

	first := PullUntil(t, sub, 10*time.Second, func(got []*pubsubpb.ReceivedMessage) bool { return len(got) == 2 })
	ackIDs := map[string]string{}
	for _, m := range first {
		ackIDs[m.Message.MessageId] = m.AckId
	}
	c := Client(t)
	require.NoError(t, c.SubscriptionAdminClient.ModifyAckDeadline(context.Background(), &pubsubpb.ModifyAckDeadlineRequest{
		Subscription: sub, AckIds: []string{ackIDs[ids[0]]}, AckDeadlineSeconds: 60,
	}))

	again := PullUntil(t, sub, 10*time.Second, func(got []*pubsubpb.ReceivedMessage) bool { return len(got) > 0 })
	require.Len(t, again, 1)
	require.Equal(t, ids[1], again[0].Message.MessageId, "the message whose deadline expired comes back")

	// An ack by the first delivery's ack id is ignored once the message was redelivered:
	// acknowledging after the lease ended is not reliable.
	require.NoError(t, c.SubscriptionAdminClient.Acknowledge(context.Background(), &pubsubpb.AcknowledgeRequest{
		Subscription: sub, AckIds: []string{ackIDs[ids[0]], ackIDs[ids[1]], again[0].AckId},
	}))
	fake := Fake(t)
	require.Equal(t, 1, fake.Message(ids[0]).Deliveries)
	require.Equal(t, 2, fake.Message(ids[1]).Deliveries)
	require.NotEmpty(t, fake.Message(ids[0]).Modacks)
}

// TestOrderingKeys: on an ordered subscription, messages of one key arrive in publish order,
// and the next one of a key is delivered only after the previous one was acknowledged.
func TestOrderingKeys(t *testing.T) {
	t.Parallel()
	topic := Topic(t)
	sub := Subscription(t, topic, SubscriptionConfig{Ordered: true})
	var msgs []Message
	for i := range 5 {
		for _, k := range []string{"k1", "k2"} {
			msgs = append(msgs, Message{Data: fmt.Sprintf("%s-%d", k, i), OrderingKey: k})
		}
	}
	Publish(t, topic, msgs...)

	if Addr(t); fake != nil {
		// pstest holds back the second message of a key while the first is outstanding.
		first := PullUntil(t, sub, 10*time.Second, func(got []*pubsubpb.ReceivedMessage) bool { return len(got) >= 2 })
		require.Len(t, first, 2)
		keys := map[string]string{}
		for _, m := range first {
			keys[m.Message.OrderingKey] = string(m.Message.Data)
		}
		require.Equal(t, map[string]string{"k1": "k1-0", "k2": "k2-0"}, keys)
		c := Client(t)
		require.NoError(t, c.SubscriptionAdminClient.ModifyAckDeadline(context.Background(), &pubsubpb.ModifyAckDeadlineRequest{
			Subscription: sub, AckIds: []string{first[0].AckId, first[1].AckId}, AckDeadlineSeconds: 0,
		}))
	}

	order := map[string][]string{}
	n := 0
	receive(t, sub, func(m *pubsub.Message) bool {
		m.Ack()
		order[m.OrderingKey] = append(order[m.OrderingKey], string(m.Data))
		n++
		return n == len(msgs)
	})
	require.Equal(t, []string{"k1-0", "k1-1", "k1-2", "k1-3", "k1-4"}, order["k1"])
	require.Equal(t, []string{"k2-0", "k2-1", "k2-2", "k2-3", "k2-4"}, order["k2"])
}

// TestDeadLetterPolicy: a message delivered MaxDeliveryAttempts times without an ack is
// forwarded to the dead-letter topic, and each delivery carries its attempt number.
func TestDeadLetterPolicy(t *testing.T) {
	t.Parallel()
	topic, dlq := Topic(t), Topic(t)
	dlqSub := Subscription(t, dlq, SubscriptionConfig{})
	sub := Subscription(t, topic, SubscriptionConfig{DeadLetterTopic: dlq, MaxDeliveryAttempts: 5})
	Publish(t, topic, Message{Data: "poison", Attributes: map[string]string{"operation-id": "op-p"}})

	var attempts []int
	receive(t, sub, func(m *pubsub.Message) bool {
		attempts = append(attempts, *m.DeliveryAttempt)
		m.Nack()
		return len(attempts) == 5
	})
	require.Equal(t, []int{1, 2, 3, 4, 5}, attempts)

	dead := PullUntil(t, dlqSub, 30*time.Second, func(got []*pubsubpb.ReceivedMessage) bool { return len(got) > 0 })
	require.Equal(t, "poison", string(dead[0].Message.Data))
	require.Equal(t, "op-p", dead[0].Message.Attributes["operation-id"])
}

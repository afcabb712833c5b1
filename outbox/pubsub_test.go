package outbox

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idemd/idemd/internal/pubsubtest"
)

func testEvent(topic, key, payload string, ordinal int) Event {
	return Event{
		Topic: topic, Key: []byte(key), Payload: []byte(payload), Pipeline: "pipe", CausationID: "msg-" + payload,
		OperationID: OperationID("pipe", "msg-"+payload, ordinal),
		Headers:     map[string]string{HeaderContentType: "application/json", HeaderEventType: "order.paid", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
	}
}

func newPubSubPublisher(t *testing.T, c *pubsub.Client, cfg *PubSubPublisherConfig) *PubSubPublisher {
	t.Helper()
	p, err := NewPubSubPublisher(c, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// TestPubSubPublisher: every event becomes a message with the outbox headers as attributes
// (ours win over the event's), the key as ordering key, in key order.
func TestPubSubPublisher(t *testing.T) {
	t.Parallel()
	topic := pubsubtest.Topic(t)
	sub := pubsubtest.Subscription(t, topic, pubsubtest.SubscriptionConfig{Ordered: true})
	p := newPubSubPublisher(t, pubsubtest.Client(t), nil)

	var events []Event
	for i := range 4 {
		events = append(events, testEvent(pubsubtest.ID(topic), "k1", fmt.Sprintf(`{"k":1,"i":%d}`, i), 0))
		events = append(events, testEvent(topic, "k2", fmt.Sprintf(`{"k":2,"i":%d}`, i), 0))
	}
	events = append(events, testEvent(topic, "", `{"nokey":true}`, 0))
	events[0].Headers[HeaderOperationID] = "spoofed"
	for i, err := range p.Publish(context.Background(), events) {
		require.NoError(t, err, "event %d", i)
	}

	got := map[string][]string{}
	var first *pubsub.Message
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n := 0
	var mu sync.Mutex // Receive calls back from many goroutines
	err := pubsubtest.Client(t).Subscriber(sub).Receive(ctx, func(_ context.Context, m *pubsub.Message) {
		mu.Lock()
		defer mu.Unlock()
		m.Ack()
		if string(m.Data) == string(events[0].Payload) {
			first = m
		}
		got[m.OrderingKey] = append(got[m.OrderingKey], string(m.Data))
		if n++; n == len(events) {
			cancel()
		}
	})
	require.NoError(t, err)
	require.Equal(t, len(events), n)
	require.Equal(t, []string{`{"k":1,"i":0}`, `{"k":1,"i":1}`, `{"k":1,"i":2}`, `{"k":1,"i":3}`}, got["k1"])
	require.Equal(t, []string{`{"k":2,"i":0}`, `{"k":2,"i":1}`, `{"k":2,"i":2}`, `{"k":2,"i":3}`}, got["k2"])
	require.Equal(t, []string{`{"nokey":true}`}, got[""])
	require.Equal(t, map[string]string{
		HeaderOperationID: events[0].OperationID.String(), HeaderCausationID: events[0].CausationID, HeaderPipeline: "pipe",
		HeaderContentType: "application/json", HeaderEventType: "order.paid", "traceparent": events[0].Headers["traceparent"],
	}, first.Attributes)
}

// TestPubSubPublisherRefusals: a missing topic and events Pub/Sub can never take fail
// permanently, each alone; the other events of the call are published.
func TestPubSubPublisherRefusals(t *testing.T) {
	t.Parallel()
	topic := pubsubtest.Topic(t)
	sub := pubsubtest.Subscription(t, topic, pubsubtest.SubscriptionConfig{})
	p := newPubSubPublisher(t, pubsubtest.Client(t), nil)

	noOp := testEvent(topic, "", "no-op", 0)
	noOp.OperationID = uuid.Nil
	events := []Event{
		testEvent(pubsubtest.TopicName(pubsubtest.Name(t)), "", "missing topic", 0),
		testEvent(topic, "\xff\xfe", "binary key", 0),
		testEvent(topic, "", string(make([]byte, 11<<20)), 0), // above Pub/Sub's 10 MB
		noOp,
		testEvent(topic, "", "fine", 0),
	}
	errs := p.Publish(context.Background(), events)
	require.ErrorIs(t, errs[0], ErrNoDestination)
	require.ErrorIs(t, errs[0], ErrPermanent)
	for i := 1; i < 4; i++ {
		require.ErrorIs(t, errs[i], ErrPermanent, "event %d", i)
		require.NotErrorIs(t, errs[i], ErrNoDestination, "event %d", i)
	}
	require.NoError(t, errs[4])
	got := pubsubtest.PullUntil(t, sub, 10*time.Second, func(m []*pubsubpb.ReceivedMessage) bool { return len(m) > 0 })
	require.Len(t, got, 1)
	require.Equal(t, "fine", string(got[0].Message.Data))
}

// failingPubSub is a pstest server that refuses every publish with code.
func failingPubSub(t *testing.T, code codes.Code) *pubsub.Client {
	t.Helper()
	srv := pstest.NewServer(pstest.WithErrorInjection("Publish", code, "injected"))
	t.Cleanup(func() { _ = srv.Close() })
	c, err := pubsub.NewClient(context.Background(), pubsubtest.Project, option.WithEndpoint(srv.Addr),
		option.WithoutAuthentication(), option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_, err = c.TopicAdminClient.CreateTopic(context.Background(), &pubsubpb.Topic{Name: pubsubtest.TopicName("t")})
	require.NoError(t, err)
	return c
}

// TestPubSubPublisherKeyHeldAfterFailure: when an event of a key fails, the later events of
// that key fail without reaching Pub/Sub, and the next round tries the key again.
func TestPubSubPublisherKeyHeldAfterFailure(t *testing.T) {
	t.Parallel()
	p := newPubSubPublisher(t, failingPubSub(t, codes.InvalidArgument), nil)
	round := func() []error {
		return p.Publish(context.Background(), []Event{testEvent("t", "k", "1", 0), testEvent("t", "k", "2", 0), testEvent("t", "k", "3", 0)})
	}
	for range 2 {
		errs := round()
		require.ErrorIs(t, errs[0], ErrPermanent)
		require.ErrorContains(t, errs[0], "injected", "the key's first event reached the broker: the key was resumed")
		for _, err := range errs[1:] {
			require.Error(t, err)
			require.NotErrorIs(t, err, ErrPermanent)
			require.ErrorContains(t, err, "earlier event of key")
		}
	}
}

// TestPubSubPublisherTransient: an outage is a transient error, within the timeout.
func TestPubSubPublisherTransient(t *testing.T) {
	t.Parallel()
	p := newPubSubPublisher(t, failingPubSub(t, codes.Unavailable), &PubSubPublisherConfig{Timeout: 300 * time.Millisecond})
	errs := p.Publish(context.Background(), []Event{testEvent("t", "", "1", 0)})
	require.Error(t, errs[0])
	require.NotErrorIs(t, errs[0], ErrPermanent)
}

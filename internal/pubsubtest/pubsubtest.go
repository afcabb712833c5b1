// Package pubsubtest gives tests a Google Cloud Pub/Sub endpoint, clients on it, and topics and
// subscriptions unique to each test. The endpoint is TEST_PUBSUB_EMULATOR_HOST when set (the
// gcloud emulator, or any server of the Pub/Sub gRPC API without TLS), else Google's
// in-process fake, cloud.google.com/go/pubsub/v2/pstest, started on first use and shared by
// the whole test binary. Topics and subscriptions are deleted at cleanup.
package pubsubtest

import (
	"context"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemd/idemd/internal/testname"
)

// Project is the Google Cloud project of the tests' topics and subscriptions.
const Project = "idemd-test"

var (
	once sync.Once
	addr string
	fake *pstest.Server
)

// Addr returns the address of the tests' Pub/Sub, starting pstest on first use.
func Addr(tb testing.TB) string {
	tb.Helper()
	once.Do(func() {
		if a := os.Getenv("TEST_PUBSUB_EMULATOR_HOST"); a != "" {
			addr = a
			return
		}
		// The fake lives as long as the test binary: it is in memory only.
		fake = pstest.NewServer()
		addr = fake.Addr
	})
	return addr
}

// Fake returns the in-process pstest server, whose bookkeeping (deliveries, acks, modacks per
// message) tests may read, or skips the test when TEST_PUBSUB_EMULATOR_HOST is used.
func Fake(tb testing.TB) *pstest.Server {
	tb.Helper()
	Addr(tb)
	if fake == nil {
		tb.Skip("pubsubtest: TEST_PUBSUB_EMULATOR_HOST is set; this test reads pstest's bookkeeping")
	}
	return fake
}

// ClientOptions connect a client to the tests' Pub/Sub without TLS or credentials, as the
// client does by itself when PUBSUB_EMULATOR_HOST is set, and without the client's own
// telemetry, as idemd's clients (internal/brokerenv): the helpers' calls record no span on
// a global provider a test installs.
func ClientOptions(tb testing.TB) []option.ClientOption {
	tb.Helper()
	return []option.ClientOption{
		option.WithEndpoint(Addr(tb)),
		option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())),
		option.WithTelemetryDisabled(),
	}
}

var (
	sharedOnce sync.Once
	shared     *pubsub.Client
	sharedErr  error
)

// admin is the client of the helpers below, one for the whole test binary: a client per
// call would keep a connection of its own until the test's cleanup, and a long test pulling
// in a loop would run the process out of descriptors.
func admin(tb testing.TB) *pubsub.Client {
	tb.Helper()
	opts := ClientOptions(tb)
	sharedOnce.Do(func() { shared, sharedErr = pubsub.NewClient(context.Background(), Project, opts...) })
	if sharedErr != nil {
		tb.Fatalf("pubsubtest: client: %v", sharedErr)
	}
	return shared
}

// Client returns a new client on the tests' Pub/Sub, closed at cleanup.
func Client(tb testing.TB) *pubsub.Client {
	tb.Helper()
	c, err := pubsub.NewClient(context.Background(), Project, ClientOptions(tb)...)
	if err != nil {
		tb.Fatalf("pubsubtest: client: %v", err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

var unsafeName = regexp.MustCompile(`[^a-zA-Z0-9._~+%-]+`)

// Name returns an id unique to this test and this run, valid for a topic or a subscription
// (3 to 255 characters, starting with a letter).
func Name(tb testing.TB) string {
	tb.Helper()
	return "t" + testname.Unique(tb, unsafeName, 80)
}

// TopicName is the full resource name of topic id in Project.
func TopicName(id string) string { return "projects/" + Project + "/topics/" + id }

// SubscriptionName is the full resource name of subscription id in Project.
func SubscriptionName(id string) string { return "projects/" + Project + "/subscriptions/" + id }

// Topic creates a topic unique to this test and returns its full name.
func Topic(tb testing.TB) string {
	tb.Helper()
	c := admin(tb)
	name := TopicName(Name(tb))
	if _, err := c.TopicAdminClient.CreateTopic(ctx(tb), &pubsubpb.Topic{Name: name}); err != nil {
		tb.Fatalf("pubsubtest: creating topic %s: %v", name, err)
	}
	tb.Cleanup(func() {
		_ = c.TopicAdminClient.DeleteTopic(context.Background(), &pubsubpb.DeleteTopicRequest{Topic: name})
	})
	return name
}

// SubscriptionConfig shapes a subscription.
type SubscriptionConfig struct {
	// Ordered enables message ordering: messages of one ordering key are delivered in
	// publish order, the next only once the previous one is acknowledged.
	Ordered bool
	// AckDeadline is the lease of a delivered message. Defaults to 10 s. pstest accepts
	// 1 s; the emulator and Pub/Sub want at least 10 s.
	AckDeadline time.Duration
	// DeadLetterTopic, with MaxDeliveryAttempts (at least 5 on Pub/Sub; pstest takes any),
	// forwards a message delivered that many times without an ack.
	DeadLetterTopic     string
	MaxDeliveryAttempts int32
}

// Subscription creates a subscription unique to this test on topic and returns its full name.
func Subscription(tb testing.TB, topic string, cfg SubscriptionConfig) string {
	tb.Helper()
	c := admin(tb)
	name := SubscriptionName(Name(tb))
	s := &pubsubpb.Subscription{
		Name: name, Topic: topic, EnableMessageOrdering: cfg.Ordered,
		AckDeadlineSeconds: int32(cfg.AckDeadline / time.Second),
	}
	if cfg.DeadLetterTopic != "" {
		s.DeadLetterPolicy = &pubsubpb.DeadLetterPolicy{DeadLetterTopic: cfg.DeadLetterTopic, MaxDeliveryAttempts: cfg.MaxDeliveryAttempts}
		s.RetryPolicy = &pubsubpb.RetryPolicy{MinimumBackoff: durationpb.New(0), MaximumBackoff: durationpb.New(0)}
	}
	if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx(tb), s); err != nil {
		tb.Fatalf("pubsubtest: creating subscription %s: %v", name, err)
	}
	tb.Cleanup(func() {
		_ = c.SubscriptionAdminClient.DeleteSubscription(context.Background(), &pubsubpb.DeleteSubscriptionRequest{Subscription: name})
	})
	return name
}

// Message is one message to Publish.
type Message struct {
	Data        string
	Attributes  map[string]string
	OrderingKey string
}

// Publish publishes msgs on topic through the client's Publisher, with message ordering
// enabled, waits for every result and returns the message ids.
func Publish(tb testing.TB, topic string, msgs ...Message) []string {
	tb.Helper()
	p := admin(tb).Publisher(topic)
	p.EnableMessageOrdering = true
	defer p.Stop()
	results := make([]*pubsub.PublishResult, len(msgs))
	for i, m := range msgs {
		results[i] = p.Publish(ctx(tb), &pubsub.Message{Data: []byte(m.Data), Attributes: m.Attributes, OrderingKey: m.OrderingKey})
	}
	ids := make([]string, len(msgs))
	for i, r := range results {
		id, err := r.Get(ctx(tb))
		if err != nil {
			tb.Fatalf("pubsubtest: publishing message %d on %s: %v", i, topic, err)
		}
		ids[i] = id
	}
	return ids
}

// Pull makes one synchronous Pull of up to max messages on subscription; it waits a little
// for the first when none is ready.
func Pull(tb testing.TB, subscription string, max int32) []*pubsubpb.ReceivedMessage {
	tb.Helper()
	out, err := admin(tb).SubscriptionAdminClient.Pull(ctx(tb), &pubsubpb.PullRequest{Subscription: subscription, MaxMessages: max})
	if err != nil {
		tb.Fatalf("pubsubtest: pulling %s: %v", subscription, err)
	}
	return out.ReceivedMessages
}

// PullUntil pulls until done returns true for the messages received so far, failing the
// test after timeout. Each Pull blocks until a message is ready or a short wait ends.
func PullUntil(tb testing.TB, subscription string, timeout time.Duration, done func([]*pubsubpb.ReceivedMessage) bool) []*pubsubpb.ReceivedMessage {
	tb.Helper()
	var got []*pubsubpb.ReceivedMessage
	deadline := time.Now().Add(timeout)
	for !done(got) {
		if time.Now().After(deadline) {
			tb.Fatalf("pubsubtest: %d messages pulled from %s within %s, not the ones awaited", len(got), subscription, timeout)
		}
		got = append(got, Pull(tb, subscription, 100)...)
	}
	return got
}

// ID returns the last element of a full resource name.
func ID(name string) string { return name[strings.LastIndex(name, "/")+1:] }

func ctx(tb testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	tb.Cleanup(cancel)
	return c
}

package brokerenv

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"go.opentelemetry.io/otel"

	"github.com/idemd/idemd/internal/sqsfake"
	"github.com/idemd/idemd/internal/tracing"
)

func env(kv map[string]string) Lookup {
	return func(name string) (string, bool) { v, ok := kv[name]; return v, ok }
}

func TestClientsNeedAProjectAndARegion(t *testing.T) {
	t.Setenv("AWS_CONFIG_FILE", t.TempDir()+"/none")
	t.Setenv("AWS_REGION", "")
	t.Setenv("AWS_DEFAULT_REGION", "")
	cs := New(env(map[string]string{"PUBSUB_EMULATOR_HOST": "127.0.0.1:1"}))
	defer cs.Close() //nolint:errcheck
	ctx := context.Background()
	if _, err := cs.PubSub(ctx, ""); !errors.Is(err, ErrNoProject) {
		t.Errorf("PubSub without a project: %v, want ErrNoProject", err)
	}
	if _, err := cs.PubSub(ctx, "explicit"); err != nil {
		t.Errorf("PubSub with a project: %v", err)
	}
	if _, err := cs.SQS(ctx); !errors.Is(err, ErrNoRegion) {
		t.Errorf("SQS without a region: %v, want ErrNoRegion", err)
	}
	for _, tc := range []struct {
		kv   map[string]string
		want string
	}{
		{map[string]string{"PUBSUB_PROJECT_ID": "a", "GOOGLE_CLOUD_PROJECT": "b"}, "a"},
		{map[string]string{"GOOGLE_CLOUD_PROJECT": "b"}, "b"},
		{map[string]string{"PUBSUB_PROJECT_ID": "", "GOOGLE_CLOUD_PROJECT": "b"}, "b"},
	} {
		if got := PubSubProject(env(tc.kv)); got != tc.want {
			t.Errorf("PubSubProject(%v) = %q, want %q", tc.kv, got, tc.want)
		}
	}
	if got := SQSEndpoint(env(map[string]string{"AWS_ENDPOINT_URL": "http://b", "AWS_ENDPOINT_URL_SQS": "http://a"})); got != "http://a" {
		t.Errorf("SQSEndpoint prefers AWS_ENDPOINT_URL_SQS, got %q", got)
	}
}

// The dev fakes: the resources the pipelines name exist, and clients made from the dev
// environment reach them (a Pub/Sub topic and its namesake subscription, an SQS FIFO queue).
func TestStartDevCreatesWhatThePipelinesName(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	base := env(map[string]string{})
	d, err := StartDev(ctx, DevNeeds{PubSubTopics: []string{"payments"}, PubSubSubscriptions: []string{"orders"}, SQSQueues: []string{"ledger.fifo", "plain"}}, base)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close() //nolint:errcheck
	if d.Env["PUBSUB_PROJECT_ID"] != DevProject || d.Env["AWS_ENDPOINT_URL_SQS"] == "" {
		t.Fatalf("dev env = %v", d.Env)
	}
	cs := New(d.lookup(base))
	defer cs.Close() //nolint:errcheck

	ps, err := cs.PubSub(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"payments", "orders"} {
		res := ps.Publisher(id).Publish(ctx, &pubsub.Message{Data: []byte("hello " + id)})
		if _, err := res.Get(ctx); err != nil {
			t.Fatalf("publishing to dev topic %s: %v", id, err)
		}
		rctx, stop := context.WithCancel(ctx)
		var got string
		err := ps.Subscriber(id).Receive(rctx, func(_ context.Context, m *pubsub.Message) {
			got = string(m.Data)
			m.Ack()
			stop()
		})
		if err != nil || got != "hello "+id {
			t.Fatalf("dev subscription %s received %q (%v)", id, got, err)
		}
	}

	q, err := cs.SQS(ctx)
	if err != nil {
		t.Fatal(err)
	}
	url, err := q.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String("ledger.fifo")})
	if err != nil {
		t.Fatal(err)
	}
	// goaws keeps no FifoQueue attribute: a FIFO queue is one whose name ends in .fifo.
	if !strings.HasSuffix(aws.ToString(url.QueueUrl), "/ledger.fifo") {
		t.Errorf("ledger.fifo's URL = %s", aws.ToString(url.QueueUrl))
	}
	if _, err := q.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String("plain")}); err != nil {
		t.Errorf("queue plain: %v", err)
	}
}

// TestClientsMakeNoSpansOfTheirOwn: the Google client's default telemetry (a gRPC stats
// handler on OpenTelemetry's global provider) is off in the clients Clients makes: with a
// recording provider installed globally, as serve installs its own when OTEL_* turns
// tracing on, the admin calls check makes and a publish record no span
// (google.pubsub.v1.Publisher/Publish and the like would be root traces of their own,
// unrelated to the message's; idemd makes its own spans). The AWS SDK's tracing is off
// unless given a provider (it has no OpenTelemetry of its own): SQS calls record none either.
func TestClientsMakeNoSpansOfTheirOwn(t *testing.T) {
	// Not parallel: it installs a global provider, which it restores before returning.
	t.Setenv("AWS_CONFIG_FILE", t.TempDir()+"/none")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", t.TempDir()+"/none")
	provider, exporter := tracing.InMemory()
	defer provider.Shutdown(context.Background()) //nolint:errcheck
	before := otel.GetTracerProvider()
	otel.SetTracerProvider(provider)
	defer otel.SetTracerProvider(before)

	ps := pstest.NewServer()
	defer ps.Close() //nolint:errcheck
	fake, err := sqsfake.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close() //nolint:errcheck
	cs := New(env(map[string]string{
		"PUBSUB_EMULATOR_HOST": ps.Addr, "PUBSUB_PROJECT_ID": "spans",
		"AWS_ENDPOINT_URL_SQS": fake.URL(), "AWS_REGION": sqsfake.Region, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
	}))
	defer cs.Close() //nolint:errcheck
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	cl, err := cs.PubSub(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	topic, sub := "projects/spans/topics/t", "projects/spans/subscriptions/s"
	if _, err := cl.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: topic}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{Name: sub, Topic: topic}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.TopicAdminClient.GetTopic(ctx, &pubsubpb.GetTopicRequest{Topic: topic}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.SubscriptionAdminClient.GetSubscription(ctx, &pubsubpb.GetSubscriptionRequest{Subscription: sub}); err != nil {
		t.Fatal(err)
	}
	pub := cl.Publisher(topic)
	if _, err := pub.Publish(ctx, &pubsub.Message{Data: []byte("hello")}).Get(ctx); err != nil {
		t.Fatal(err)
	}
	pub.Stop()

	sq, err := cs.SQS(ctx)
	if err != nil {
		t.Fatal(err)
	}
	q, err := sq.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String("spans")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sq.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: q.QueueUrl, MessageBody: aws.String("hello")}); err != nil {
		t.Fatal(err)
	}

	var names []string
	for _, s := range exporter.GetSpans() {
		names = append(names, s.Name)
	}
	if len(names) > 0 {
		t.Fatalf("the clients recorded spans of their own: %v", names)
	}
}

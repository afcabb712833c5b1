package brokerenv

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
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

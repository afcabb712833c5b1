package config

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/outbox"
	"github.com/idemd/idemd/pipeline"
)

// brokerTargets publishes to Kafka, Pub/Sub (by id and by full name) and SQS (by name and
// by URL), each beside or without HTTP.
const brokerTargets = `sources:
  - name: billing
    verify: {scheme: stripe, secrets_env: STRIPE_WEBHOOK_SECRET}
    publish:
      - {topic: billing.events}
      - {pubsub: {topic: billing-events}, key: {json: /data/object/id}}
      - {sqs: {queue: payments.fifo}, key: {json: /data/object/id}}
      - pubsub: {topic: projects/acme-prod/topics/audit}
        http: {url: "https://audit.example/in", secret_env: ERP_SECRET}
subscriptions:
  - name: ledger
    topics: [webhooks.stripe]
    effect: {sql: "INSERT INTO ledger (id) VALUES (@message_id)"}
    publish: {sqs: {queue: "https://sqs.eu-west-1.amazonaws.com/123456789012/ledger"}}
`

func TestLoadBrokerTargets(t *testing.T) {
	t.Parallel()
	f, err := Parse("b.yaml", []byte(brokerTargets), routingLookup)
	require.NoError(t, err)
	ts := f.Sources[0].Publish
	require.Equal(t, &pipeline.PubSubTarget{Topic: "billing-events"}, ts[1].PubSub)
	require.Equal(t, &pipeline.SQSTarget{Queue: "payments.fifo"}, ts[2].SQS)
	var dests []string
	for i := range ts {
		dests = append(dests, ts[i].Destination())
	}
	require.Equal(t, []string{"billing.events", "pubsub:billing-events", "sqs:payments.fifo", "pubsub:projects/acme-prod/topics/audit"}, dests)
	require.Equal(t, outbox.SQSDestination("https://sqs.eu-west-1.amazonaws.com/123456789012/ledger"), f.Subscriptions[0].Publish[0].Destination())
	require.Equal(t, []string{"billing.events", "webhooks.stripe"}, f.Topics(), "Topics lists Kafka's")
	require.Len(t, f.DeliveryEndpoints(), 1)
	require.Empty(t, f.Warnings())
}

func TestErrorsBrokerTargets(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, from, to string
		line           int
		field, msg     string
	}{
		{"sqs without queue", "{sqs: {queue: payments.fifo}, key", "{sqs: {}, key", 7, "publish[2].sqs.queue", "required"},
		{"pubsub without topic", "{pubsub: {topic: billing-events}, key", "{pubsub: {}, key", 6, "publish[1].pubsub.topic", "required"},
		{"two brokers", "{topic: billing.events}", "{topic: billing.events, sqs: {queue: q}}", 5, "publish[0]", "topic, sqs: one broker per target"},
		{"three brokers", "{topic: billing.events}", "{topic: billing.events, pubsub: {topic: abc}, sqs: {queue: q}}", 5, "publish[0]", "topic, pubsub, sqs: one broker per target"},
		{"nothing", "{topic: billing.events}", "{name: nothing}", 5, "publish[0]", "want topic, pubsub, sqs or http"},
		{"bad queue name", "queue: payments.fifo", "queue: pay ments", 7, "publish[2].sqs.queue", "not an SQS queue name"},
		{"bad queue URL", "queue: payments.fifo", "queue: \"ftp://x/y\"", 7, "publish[2].sqs.queue", "not an SQS queue URL"},
		{"bad pubsub topic", "topic: billing-events", "topic: goog-events", 6, "publish[1].pubsub.topic", "not a Pub/Sub topic id"},
		{"bad pubsub name", "projects/acme-prod/topics/audit", "projects/acme-prod/subscriptions/audit", 8, "publish[3].pubsub.topic", "not a Pub/Sub topic name"},
		{"encoded destination as a Kafka topic", "{topic: billing.events}", "{topic: \"sqs:q\"}", 5, "publish[0].topic", "not a Kafka topic"},
		{"unknown key under sqs", "{sqs: {queue: payments.fifo}, key", "{sqs: {queue: payments.fifo, url: x}, key", 7, "publish[2].sqs.url", "unknown key"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			require.Contains(t, brokerTargets, c.from)
			_, err := Parse("b.yaml", []byte(strings.Replace(brokerTargets, c.from, c.to, 1)), routingLookup)
			require.Error(t, err)
			requireNames(t, err, "b.yaml", c.line, `sources[0] "billing"`, c.field, c.msg)
		})
	}
	// A single target is named without an index.
	_, err := Parse("b.yaml", []byte(strings.Replace(brokerTargets, "publish: {sqs: {queue: \"https", "publish: {sqs: {queue: \"\"}, x: {queue: \"https", 1)), routingLookup)
	require.Error(t, err)
	requireNames(t, err, "b.yaml", 14, `subscriptions[0] "ledger"`, "publish.sqs.queue", "required")
}

// A keyed target on a standard SQS queue is a warning: SQS keeps no order there.
func TestStandardQueueOrderWarning(t *testing.T) {
	t.Parallel()
	f, err := Parse("b.yaml", []byte(strings.Replace(brokerTargets, "queue: payments.fifo", "queue: payments", 1)), routingLookup)
	require.NoError(t, err)
	warnings := f.Warnings()
	require.Len(t, warnings, 1)
	require.EqualError(t, warnings[0], `b.yaml:7: sources[0] "billing": publish[2].sqs.queue: payments is a standard queue, which keeps no order: events of one key may arrive out of order; use a FIFO queue (a name ending in .fifo), whose MessageGroupId is the key`)
}

package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/idemd/idemd/config"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/internal/pubsubtest"
	"github.com/idemd/idemd/internal/sqstest"
	"github.com/idemd/idemd/internal/tracing"
)

// TestTraceAcrossBrokers (issues 13 and 16): a signed webhook carrying a traceparent,
// through the daemon's wiring in this process, published to a Pub/Sub topic, applied by a
// Pub/Sub subscription that publishes to an SQS FIFO queue, applied by an SQS subscription.
// Every span is in the sender's trace and forms one tree: the subscriptions continue the
// traceparent attribute the relay published, and the relay's sends are spans of the
// broker they reach (messaging.system gcp_pubsub, aws_sqs). No span holds the payload.
func TestTraceAcrossBrokers(t *testing.T) {
	t.Parallel()
	const (
		traceID  = "5bf92f3577b34da6a3ce929d0e0e4737"
		senderID = "01f067aa0ba902b8"
	)
	schema := testSchema(t)
	pool := pgtest.Pool(t, 2)
	_, err := pool.Exec(context.Background(), fmt.Sprintf(`CREATE SCHEMA %[1]s;
CREATE TABLE %[1]s.hops (hop text NOT NULL, message_id text NOT NULL)`, schema))
	require.NoError(t, err)
	topic := pubsubtest.Topic(t)
	sub := pubsubtest.Subscription(t, topic, pubsubtest.SubscriptionConfig{})
	queue := sqstest.FIFOQueue(t, nil)

	env := map[string]string{
		"TRACE_STRIPE_SECRET":  stripeSecret,
		"PUBSUB_EMULATOR_HOST": pubsubtest.Addr(t), "PUBSUB_PROJECT_ID": pubsubtest.Project,
		"AWS_ENDPOINT_URL_SQS": sqstest.Endpoint(t), "AWS_REGION": "us-east-1",
		"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
	}
	lookup := func(name string) (string, bool) { v, ok := env[name]; return v, ok }
	f, err := config.Parse("idemd.yaml", fmt.Appendf(nil, `sources:
  - name: stripe
    verify: {scheme: stripe, secrets_env: [TRACE_STRIPE_SECRET]}
    effect: {sql: "INSERT INTO %[1]s.hops VALUES ('webhook', @message_id)"}
    publish: {pubsub: {topic: %[2]s}, key: {json: /data/object/id}}
subscriptions:
  - name: gcp
    pubsub: {subscription: %[3]s}
    message_id: {attribute: operation-id}
    effect: {sql: "INSERT INTO %[1]s.hops VALUES ('pubsub', @message_id)"}
    publish: {sqs: {queue: %[4]s}, key: {json: /data/object/id}}
  - name: aws
    sqs: {queue: %[4]s}
    message_id: {attribute: operation-id}
    effect: {sql: "INSERT INTO %[1]s.hops VALUES ('sqs', @message_id)"}
`, schema, topic, sub, queue), lookup)
	require.NoError(t, err)

	var ended tracing.Ended
	ended.Init(t)
	provider, exporter := tracing.InMemory(&ended)
	d, _ := inProcess(t, &daemonConfig{
		DatabaseURL: pgtest.URL(), Schema: schema, MaxConns: 8, Lookup: lookup,
		Pipelines: f, Roles: []role{roleReceiver, roleConsumer, roleRelay}, Migrate: true,
		HTTPAddr: "127.0.0.1:0", AdminAddr: "127.0.0.1:0", ShutdownTimeout: 20 * time.Second,
		TracerProvider: provider,
	})
	addrs := d.signals.ready.Wait(t)

	sendTraced(t, "http://"+addrs[0]+"/webhooks/stripe", traceID, senderID,
		`{"id":"evt_traced_brokers","type":"charge.succeeded","data":{"object":{"id":"ch_1","amount":31337272}}}`)

	// The last span of the flow is the SQS subscription's effect; wait until it and every
	// parent above it ended.
	effectOf := func(tree spanTree, pipeline string) (tracetest.SpanStub, bool) {
		for _, s := range tree.spans {
			if p, _ := tracing.Attr(s, tracing.AttrPipeline); s.Name == "idemd.effect" && p == pipeline {
				return s, true
			}
		}
		return tracetest.SpanStub{}, false
	}
	tree := newSpanTree(exporter.GetSpans(), traceID)
	for {
		if _, ok := effectOf(tree, "aws"); ok && tree.whole(senderID) {
			break
		}
		ended.Wait(t)
		tree = newSpanTree(exporter.GetSpans(), traceID)
	}
	require.Equal(t, []string{"POST /webhooks/stripe"}, tree.roots(t, senderID), "one tree; spans: %v", spanNames(exporter.GetSpans()))
	last, _ := effectOf(tree, "aws")
	path := tree.path(last)
	spans := tree.spans
	var kinds []string
	for _, name := range path {
		kinds = append(kinds, strings.Fields(name)[0])
	}
	require.Equal(t, []string{
		"POST", "idemd.transaction", "enqueue", // the webhook, its transaction, its event to Pub/Sub
		"process", "idemd.transaction", "enqueue", // the Pub/Sub subscription, its event to SQS
		"process", "idemd.transaction", "idemd.effect", // the SQS subscription's effect
	}, kinds, "the path of the last effect: %v", path)

	// The relay's sends, one per broker, in the trace.
	systems := map[string]bool{}
	for _, s := range spans {
		if strings.HasPrefix(s.Name, "send ") {
			sys, _ := tracing.Attr(s, semconv.MessagingSystemKey)
			systems[sys] = true
		}
	}
	require.Equal(t, map[string]bool{"gcp_pubsub": true, "aws_sqs": true}, systems)
	for _, s := range spans {
		text := strings.Join(tracing.Texts(s), " ")
		require.NotContains(t, text, "31337272", s.Name)
		require.NotContains(t, text, stripeSecret, s.Name)
	}
}

package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemd/idemd/config"
	"github.com/idemd/idemd/internal/kafkatest"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/internal/tracing"
)

// TestTraceAcrossEveryHop: a signed webhook carrying a traceparent, through the daemon's
// own wiring in this process — receiver, outbox, relay, Kafka, the consumer of the
// published record, and the HTTP delivery of the same event. Every span of the flow is in
// the sender's trace and the parent links form one tree rooted at the sender's span; the
// record on Kafka and the delivery request carry a traceparent of that trace; no span holds
// the payload or the signature.
func TestTraceAcrossEveryHop(t *testing.T) {
	t.Parallel()
	const (
		traceID  = "4bf92f3577b34da6a3ce929d0e0e4736"
		senderID = "00f067aa0ba902b7"
	)
	schema := testSchema(t)
	topic := kafkatest.Name(t, "traced")
	pool := pgtest.Pool(t, 2)
	_, err := pool.Exec(context.Background(), fmt.Sprintf(`CREATE SCHEMA %[1]s;
CREATE TABLE %[1]s.payments (event_id text PRIMARY KEY, amount bigint);
CREATE TABLE %[1]s.ledger (event_id text PRIMARY KEY)`, schema))
	require.NoError(t, err)

	delivered := make(chan string, 4)
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		delivered <- r.Header.Get("Traceparent")
		w.WriteHeader(http.StatusNoContent)
	}))
	defer sink.Close()

	env := map[string]string{"TRACE_STRIPE_SECRET": stripeSecret, "TRACE_SINK_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}
	f, err := config.Parse("idemd.yaml", fmt.Appendf(nil, `sources:
  - name: stripe
    verify: {scheme: stripe, secrets_env: [TRACE_STRIPE_SECRET]}
    effect:
      sql: "INSERT INTO %[1]s.payments (event_id, amount) VALUES (@message_id, (@payload::jsonb #>> '{data,object,amount}')::bigint)"
    publish: {topic: %[2]s, http: {url: %[4]q, secret_env: TRACE_SINK_SECRET}}
subscriptions:
  - name: ledger
    topics: [%[2]s]
    group: %[3]s
    effect: {sql: "INSERT INTO %[1]s.ledger (event_id) VALUES (@message_id)"}
`, schema, topic, kafkatest.Group(t), sink.URL+"/hooks"), func(name string) (string, bool) {
		v, ok := env[name]
		return v, ok
	})
	require.NoError(t, err)

	var ended tracing.Ended
	ended.Init(t)
	provider, exporter := tracing.InMemory(&ended)
	d, _ := inProcess(t, &daemonConfig{
		DatabaseURL: pgtest.URL(), Schema: schema, MaxConns: 8, Brokers: kafkatest.Brokers(t), CreateTopics: true,
		Pipelines: f, Roles: []role{roleReceiver, roleConsumer, roleRelay}, Migrate: true,
		HTTPAddr: "127.0.0.1:0", AdminAddr: "127.0.0.1:0", ShutdownTimeout: 20 * time.Second,
		TracerProvider: provider,
	})
	addrs := d.signals.ready.Wait(t)

	sendTraced(t, "http://"+addrs[0]+"/webhooks/stripe", traceID, senderID,
		`{"id":"evt_traced","type":"charge.succeeded","data":{"object":{"id":"ch_1","amount":31337271}}}`)

	// The last spans of the flow: the consumer's record, the delivery attempt (and the
	// receiver's request, which ends after its answer).
	waiting := map[string]bool{"POST /webhooks/stripe": true, "process " + topic: true, "POST": true}
	for len(waiting) > 0 {
		delete(waiting, ended.Wait(t))
	}
	spans := exporter.GetSpans()

	// One tree: every span of the trace has its parent among them, but the receiver's,
	// whose parent is the sender's span.
	tree := newSpanTree(spans, traceID)
	require.Equal(t, []string{"POST /webhooks/stripe"}, tree.roots(t, senderID))
	inTrace, path := tree.spans, tree.path
	one := func(name string, withinPipeline string) tracetest.SpanStub {
		t.Helper()
		var found []tracetest.SpanStub
		for _, s := range inTrace {
			if p, _ := tracing.Attr(s, tracing.AttrPipeline); s.Name == name && (withinPipeline == "" || p == withinPipeline) {
				found = append(found, s)
			}
		}
		require.Len(t, found, 1, "%s of %s in the trace; spans: %v", name, withinPipeline, spanNames(spans))
		return found[0]
	}
	enqueue := []string{"POST /webhooks/stripe", "idemd.transaction", "enqueue " + topic}
	require.Equal(t, append(enqueue, "send "+topic), path(one("send "+topic, "")), "the relay's publish")
	require.Equal(t, append(enqueue, "POST"), path(one("POST", "stripe")), "the HTTP delivery attempt")
	consumerEffect := append(enqueue, "process "+topic, "idemd.transaction", "idemd.effect")
	require.Equal(t, consumerEffect, path(one("idemd.effect", "ledger")), "the consumer's effect")
	require.Equal(t, enqueue[:2], path(one("idemd.effect", "stripe"))[:2])

	// What went over the wire carries the trace.
	stored := "00-" + traceID + "-" + one("enqueue "+topic, "stripe").SpanContext.SpanID().String() + "-01"
	records := kafkatest.ReadAll(t, topic, 1, 30*time.Second)
	require.Equal(t, stored, kafkatest.Header(records[0], "traceparent"), "the record on Kafka")
	attempt := one("POST", "stripe")
	require.Equal(t, "00-"+traceID+"-"+attempt.SpanContext.SpanID().String()+"-01", <-delivered, "the delivery request")

	for _, s := range spans {
		text := strings.Join(tracing.Texts(s), " ")
		require.NotContains(t, text, "31337271", s.Name)
		require.NotContains(t, text, stripeSecret, s.Name)
	}
}

// sendTraced posts a Stripe-signed webhook carrying a traceparent of traceID, from the
// sender's span senderID, and requires a 200.
func sendTraced(t *testing.T, url, traceID, senderID, body string) {
	t.Helper()
	req := stripeRequest(t, url, stripeSecret, []byte(body))
	req.Header.Set("Traceparent", "00-"+traceID+"-"+senderID+"-01")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// spanTree is the spans of one trace, by span id.
type spanTree struct {
	spans []tracetest.SpanStub
	byID  map[trace.SpanID]tracetest.SpanStub
}

func newSpanTree(all tracetest.SpanStubs, traceID string) spanTree {
	tree := spanTree{byID: map[trace.SpanID]tracetest.SpanStub{}}
	for _, s := range all {
		if s.SpanContext.TraceID().String() == traceID {
			tree.byID[s.SpanContext.SpanID()] = s
			tree.spans = append(tree.spans, s)
		}
	}
	return tree
}

// roots names the spans whose parent is not in the tree; each must be the sender's child.
func (tree spanTree) roots(t *testing.T, senderID string) []string {
	t.Helper()
	var out []string
	for _, s := range tree.spans {
		if _, ok := tree.byID[s.Parent.SpanID()]; !ok {
			require.Equal(t, senderID, s.Parent.SpanID().String(), "%s has its parent in the trace", s.Name)
			out = append(out, s.Name)
		}
	}
	return out
}

// whole reports whether every span's parent has ended too (spans end inside out: an effect
// before its transaction), but the roots', which is the sender's span.
func (tree spanTree) whole(senderID string) bool {
	for _, s := range tree.spans {
		if _, ok := tree.byID[s.Parent.SpanID()]; !ok && s.Parent.SpanID().String() != senderID {
			return false
		}
	}
	return true
}

// path names the spans from the root down to s, hop by hop.
func (tree spanTree) path(s tracetest.SpanStub) []string {
	var names []string
	for ok := true; ok; s, ok = tree.byID[s.Parent.SpanID()] {
		names = append([]string{s.Name}, names...)
	}
	return names
}

func spanNames(spans tracetest.SpanStubs) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name+"@"+s.SpanContext.TraceID().String()[:6])
	}
	return out
}

package receiver

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/internal/tracing"
)

const incomingTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// traced sets up a receiver of src recording its spans in exporter, and a server in front
// of it that says when each request's ServeHTTP returned (its span ended after the answer
// was written).
func traced(t *testing.T, src func(*pgtest.DB) Source) (b *bundle, srv *httptest.Server, served <-chan struct{}, exporter *tracetest.InMemoryExporter) {
	t.Helper()
	provider, exporter := tracing.InMemory()
	b = setup(t, 8, func(db *pgtest.DB) Config {
		return Config{Sources: []Source{src(db)}, TracerProvider: provider}
	})
	srv, served = tracedServer(t, b)
	return b, srv, served, exporter
}

func tracedServer(t *testing.T, b *bundle) (*httptest.Server, <-chan struct{}) {
	t.Helper()
	served := make(chan struct{}, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.rcv.ServeHTTP(w, r)
		served <- struct{}{}
	}))
	t.Cleanup(srv.Close)
	return srv, served
}

func (b *bundle) storedTraceparent(t *testing.T, topic string) string {
	t.Helper()
	return b.db.Text(t, `SELECT headers->>'traceparent' FROM {schema}.outbox WHERE topic = $1`, topic)
}

// TestTraceOfAWebhook: a signed webhook with a traceparent gets a server span continuing
// it, with the HTTP conventions' attributes and its message's id and outcome; the unit's
// spans are its children, and the outbox row stores the trace. Signatures, headers and the
// payload are not in any span.
func TestTraceOfAWebhook(t *testing.T) {
	t.Parallel()
	b, srv, served, exporter := traced(t, stripeSource)
	body := stripeEvent("evt_traced", 4242, "")
	sig := stripeSig(testSecret, time.Now(), body)
	r := do(t, nil, "POST", srv.URL+"/webhooks/stripe", body, http.Header{"Stripe-Signature": {sig}, "Traceparent": {incomingTraceparent}})
	require.Equal(t, 200, r.status, "%s", r.body)
	<-served

	spans := exporter.GetSpans()
	server := tracing.Named(spans, "POST /webhooks/stripe")
	require.Len(t, server, 1)
	s := server[0]
	require.Equal(t, trace.SpanKindServer, s.SpanKind)
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", s.SpanContext.TraceID().String())
	require.Equal(t, "00f067aa0ba902b7", s.Parent.SpanID().String())
	for key, want := range map[string]string{
		"http.request.method": "POST", "http.route": "/webhooks/stripe", "url.path": "/webhooks/stripe",
		"http.response.status_code": "200", "idemd.pipeline": "stripe", "idemd.message.id": "evt_traced",
		"idemd.outcome": "applied",
	} {
		got, _ := tracing.Attr(s, attribute.Key(key))
		require.Equal(t, want, got, key)
	}
	tx := tracing.Named(spans, "idemd.transaction")
	require.Len(t, tx, 1)
	require.Equal(t, s.SpanContext.SpanID(), tx[0].Parent.SpanID(), "the transaction continues the request")
	enqueue := tracing.Named(spans, "enqueue webhooks.stripe")
	require.Len(t, enqueue, 1)
	require.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-"+enqueue[0].SpanContext.SpanID().String()+"-01",
		b.storedTraceparent(t, "webhooks.stripe"))
	assertNoneHolds(t, spans, sig, "4242", testSecret, "Stripe-Signature")

	// A duplicate and a refused request are traced too, with their outcome and status.
	exporter.Reset()
	require.Equal(t, 200, do(t, nil, "POST", srv.URL+"/webhooks/stripe", body, http.Header{"Stripe-Signature": {sig}}).status)
	<-served
	require.Equal(t, 401, do(t, nil, "POST", srv.URL+"/webhooks/stripe", body, http.Header{"Stripe-Signature": {"t=1,v1=00"}}).status)
	<-served
	require.Equal(t, 404, do(t, nil, "POST", srv.URL+"/nowhere", body, nil).status)
	<-served
	spans = exporter.GetSpans()
	require.Len(t, spans, 4, "the duplicate's server and transaction spans, the 401, the 404")
	outcome, _ := tracing.Attr(spans[1], "idemd.outcome")
	require.Equal(t, "duplicate", outcome)
	status, _ := tracing.Attr(spans[2], "http.response.status_code")
	require.Equal(t, "401", status)
	require.Equal(t, "POST", spans[3].Name, "an unknown path is not a route")
	require.Equal(t, codes.Unset, spans[3].Status.Code, "a 4xx is the client's, not a server error")
}

// TestTraceOfAnAPIRequest: an API request's span has the route, the key as message id and
// the outcome; the bearer token is in no span.
func TestTraceOfAnAPIRequest(t *testing.T) {
	t.Parallel()
	_, srv, served, exporter := traced(t, ordersSource)
	r := do(t, nil, "POST", srv.URL+"/v1/orders", []byte(`{"amount":7}`), http.Header{
		"Authorization": {"Bearer token-a-0123456789"}, "Idempotency-Key": {`"key-traced"`}, "Traceparent": {incomingTraceparent},
	})
	require.Equal(t, 201, r.status, "%s", r.body)
	<-served
	spans := exporter.GetSpans()
	server := tracing.Named(spans, "POST /v1/orders")
	require.Len(t, server, 1)
	for key, want := range map[string]string{"idemd.message.id": "key-traced", "idemd.outcome": "applied", "http.response.status_code": "201"} {
		got, _ := tracing.Attr(server[0], attribute.Key(key))
		require.Equal(t, want, got, key)
	}
	tx := tracing.Named(spans, "idemd.transaction")
	require.Len(t, tx, 1)
	require.Equal(t, server[0].SpanContext.SpanID(), tx[0].Parent.SpanID())
	assertNoneHolds(t, spans, "token-a-0123456789", "Bearer")
}

// TestTraceOffPassesTheRequestsTraceOn: with tracing off, the outbox row carries the
// request's traceparent as it came, so that the sender's trace goes on downstream.
func TestTraceOffPassesTheRequestsTraceOn(t *testing.T) {
	t.Parallel()
	b := setup(t, 8, func(db *pgtest.DB) Config {
		return Config{Sources: []Source{stripeSource(db)}, TracerProvider: noop.NewTracerProvider()}
	})
	body := stripeEvent("evt_untraced", 1, "")
	r := do(t, nil, "POST", b.srv.URL+"/webhooks/stripe", body, http.Header{
		"Stripe-Signature": {stripeSig(testSecret, time.Now(), body)}, "Traceparent": {incomingTraceparent},
	})
	require.Equal(t, 200, r.status, "%s", r.body)
	require.Equal(t, incomingTraceparent, b.storedTraceparent(t, "webhooks.stripe"))
}

func assertNoneHolds(t *testing.T, spans tracetest.SpanStubs, secrets ...string) {
	t.Helper()
	for _, sp := range spans {
		text := strings.Join(tracing.Texts(sp), " ")
		for _, secret := range secrets {
			require.NotContains(t, text, secret, sp.Name)
		}
	}
}

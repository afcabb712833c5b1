package delivery_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/idemd/idemd/delivery"
	"github.com/idemd/idemd/internal/tracing"
)

const storedTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// traceparents runs an endpoint that answers 503 to the first attempt and 204 to the next,
// and returns the traceparent each attempt carried.
func traceparents(t *testing.T, b *bundle, provider trace.TracerProvider) []string {
	t.Helper()
	var (
		mu  sync.Mutex
		got []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get("Traceparent"))
		n := len(got)
		mu.Unlock()
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	ev := event("hooks", "evt-traced", "", `{"card":"4242-secret"}`)
	ev.Headers["traceparent"] = storedTraceparent
	b.enqueue(t, ev)
	b.start(t, delivery.Config{
		Endpoints:      []delivery.Endpoint{{Name: "hooks", URL: srv.URL + "/path/capability-secret", Secret: testSecret}},
		TracerProvider: provider,
	})
	b.waitFor(t, delivery.Delivered, 1)
	mu.Lock()
	defer mu.Unlock()
	return append([]string(nil), got...)
}

// TestDeliveryTrace: each attempt is a client span, a child of the trace context stored
// with the event, and its request carries the attempt span's traceparent. The URL's path
// (a capability) and the payload are in no span.
func TestDeliveryTrace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	provider, exporter := tracing.InMemory()
	got := traceparents(t, b, provider)
	require.Len(t, got, 2)

	spans := tracing.Named(exporter.GetSpans(), "POST")
	require.Len(t, spans, 2)
	for i, s := range spans {
		require.Equal(t, trace.SpanKindClient, s.SpanKind)
		require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", s.SpanContext.TraceID().String())
		require.Equal(t, "00f067aa0ba902b7", s.Parent.SpanID().String(), "attempt %d continues the stored trace", i+1)
		require.Equal(t, "00-"+s.SpanContext.TraceID().String()+"-"+s.SpanContext.SpanID().String()+"-01", got[i],
			"attempt %d carries its own span's traceparent", i+1)
		text := strings.Join(tracing.Texts(s), " ")
		require.NotContains(t, text, "capability-secret")
		require.NotContains(t, text, "4242-secret")
		for key, want := range map[string]string{"http.request.method": "POST", "idemd.endpoint": "hooks", "server.address": "127.0.0.1"} {
			v, _ := tracing.Attr(s, attribute.Key(key))
			require.Equal(t, want, v, key)
		}
	}
	status, _ := tracing.Attr(spans[0], "http.response.status_code")
	require.Equal(t, "503", status)
	require.Equal(t, codes.Error, spans[0].Status.Code)
	status, _ = tracing.Attr(spans[1], "http.response.status_code")
	require.Equal(t, "204", status)
	resend, _ := tracing.Attr(spans[1], "http.request.resend_count")
	require.Equal(t, "1", resend)
}

// TestDeliveryTraceOff: with tracing off, each attempt carries the stored traceparent as
// it is, so that the endpoint continues the sender's trace.
func TestDeliveryTraceOff(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.Equal(t, []string{storedTraceparent, storedTraceparent}, traceparents(t, b, noop.NewTracerProvider()))
}

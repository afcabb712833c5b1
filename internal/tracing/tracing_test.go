package tracing_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/segmentio/kafka-go"
	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemd/idemd/internal/tracing"
)

// env is a fixed environment for Setup.
func env(vars map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := vars[name]
		return v, ok
	}
}

func quiet() *logrus.Entry {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return logrus.NewEntry(l)
}

const incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// The Setup tests install global state (otel's provider and propagator): not parallel.

// TestSetupOffByDefault: without an endpoint or an exporter nothing is recorded, yet an
// incoming trace context passes through to what is sent on.
func TestSetupOffByDefault(t *testing.T) {
	for _, vars := range []map[string]string{
		{},
		{"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_SDK_DISABLED": "true"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_TRACES_EXPORTER": "none"},
	} {
		tr, err := tracing.Setup(t.Context(), &tracing.Config{Getenv: env(vars)})
		require.NoError(t, err)
		require.False(t, tr.Enabled(), "%v", vars)

		in := http.Header{"Traceparent": {incoming}}
		ctx, span := otel.Tracer("test").Start(tracing.ExtractHTTP(t.Context(), in), "receive")
		require.False(t, span.IsRecording())
		out := tracing.InjectKafka(ctx, nil)
		span.End()
		require.Equal(t, []kafka.Header{{Key: "traceparent", Value: []byte(incoming)}}, out, "the caller's trace goes on")
		require.NoError(t, tr.Shutdown(t.Context()))
	}
}

// TestSetupConsole: OTEL_TRACES_EXPORTER=console writes the spans, with the service name of
// OTEL_SERVICE_NAME and the resource attributes; the sampler is honoured.
func TestSetupConsole(t *testing.T) {
	var buf bytes.Buffer
	tr, err := tracing.Setup(t.Context(), &tracing.Config{
		Getenv: env(map[string]string{
			"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "idemd-test",
			"OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=ci%20run",
		}),
		ServiceVersion: "1.2.3", Console: &buf, Logger: quiet(),
	})
	require.NoError(t, err)
	require.True(t, tr.Enabled())
	_, span := otel.Tracer("test").Start(t.Context(), "apply")
	span.End()
	require.NoError(t, tr.Shutdown(t.Context()))
	for _, want := range []string{`"Name":"apply"`, `"Value":"idemd-test"`, `"Value":"1.2.3"`, `"Value":"ci run"`} {
		require.Contains(t, buf.String(), want)
	}

	buf.Reset()
	tr, err = tracing.Setup(t.Context(), &tracing.Config{
		Getenv:  env(map[string]string{"OTEL_TRACES_EXPORTER": "console", "OTEL_TRACES_SAMPLER": "always_off"}),
		Console: &buf, Logger: quiet(),
	})
	require.NoError(t, err)
	_, span = otel.Tracer("test").Start(t.Context(), "apply")
	span.End()
	require.NoError(t, tr.Shutdown(t.Context()))
	require.Empty(t, buf.String(), "always_off records nothing")
}

// TestSetupOTLP: with OTEL_EXPORTER_OTLP_ENDPOINT set, spans reach an OTLP/HTTP collector.
func TestSetupOTLP(t *testing.T) {
	var mu sync.Mutex
	var bodies []string
	received := make(chan struct{}, 1)
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, r.URL.Path+" "+string(body))
		mu.Unlock()
		select {
		case received <- struct{}{}:
		default:
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer collector.Close()
	vars := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": collector.URL, "OTEL_SERVICE_NAME": "idemd-otlp"}
	for k, v := range vars {
		t.Setenv(k, v) // the OTLP exporter reads its connection settings from the process
	}
	tr, err := tracing.Setup(t.Context(), &tracing.Config{Getenv: env(vars), Logger: quiet()})
	require.NoError(t, err)
	_, span := otel.Tracer("test").Start(t.Context(), "publish")
	span.End()
	require.NoError(t, tr.Shutdown(t.Context()))
	<-received
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, bodies, 1)
	require.True(t, strings.HasPrefix(bodies[0], "/v1/traces "), bodies[0])
	require.Contains(t, bodies[0], "idemd-otlp")
	require.Contains(t, bodies[0], "publish")
}

// TestSetupRefusesBadValues: every bad variable is reported, by name, in plain words.
func TestSetupRefusesBadValues(t *testing.T) {
	_, err := tracing.Setup(t.Context(), &tracing.Config{Getenv: env(map[string]string{
		"OTEL_TRACES_EXPORTER":     "zipkin",
		"OTEL_TRACES_SAMPLER":      "traceidratio",
		"OTEL_TRACES_SAMPLER_ARG":  "half",
		"OTEL_RESOURCE_ATTRIBUTES": "novalue",
	})})
	require.ErrorContains(t, err, `OTEL_TRACES_EXPORTER: "zipkin" is not supported (otlp, console or none)`)
	require.ErrorContains(t, err, `OTEL_TRACES_SAMPLER_ARG: "half" is not a ratio between 0 and 1`)
	require.ErrorContains(t, err, `OTEL_RESOURCE_ATTRIBUTES: "novalue" is not key=value`)

	_, err = tracing.Setup(t.Context(), &tracing.Config{Getenv: env(map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json", "OTEL_TRACES_SAMPLER": "sometimes",
	})})
	require.ErrorContains(t, err, `OTEL_EXPORTER_OTLP_PROTOCOL: "http/json" is not supported (http/protobuf or grpc)`)
	require.ErrorContains(t, err, `OTEL_TRACES_SAMPLER: "sometimes" is not a sampler`)
}

// TestPropagationAcrossHops: a trace that arrives over HTTP continues through a Kafka
// record and a stored attribute map, each hop's span a child of the previous one, one
// trace id throughout.
func TestPropagationAcrossHops(t *testing.T) {
	t.Parallel()
	provider, spans := tracing.InMemory()
	tracer := provider.Tracer("test")
	ctx := context.Background()

	// HTTP in.
	ctx, receive := tracer.Start(tracing.ExtractHTTP(ctx, http.Header{"Traceparent": {incoming}}), "receive")
	// Stored with the outbox row.
	stored := map[string]string{"content-type": "application/json"}
	tracing.InjectMap(ctx, stored)
	receive.End()

	// The relay publishes the row: its span continues the stored context; the record
	// carries it, replacing a stale traceparent the row's headers had.
	ctx, publish := tracer.Start(tracing.ExtractMap(context.Background(), stored), "publish")
	record := []kafka.Header{{Key: "operation-id", Value: []byte("op")}, {Key: "Traceparent", Value: []byte("00-stale-stale-01")}}
	out := tracing.InjectKafka(ctx, record)
	publish.End()
	require.Equal(t, "Traceparent", record[1].Key, "the caller's headers are not changed")
	var traceparents int
	for _, h := range out {
		if strings.EqualFold(h.Key, "traceparent") {
			traceparents++
			require.Equal(t, "traceparent", h.Key)
		}
	}
	require.Equal(t, 1, traceparents)

	// The consumer of the record, then an HTTP delivery.
	ctx, consume := tracer.Start(tracing.ExtractKafka(context.Background(), out), "consume")
	req := http.Header{}
	tracing.InjectHTTP(ctx, req)
	consume.End()
	_, deliver := tracer.Start(tracing.ExtractHTTP(context.Background(), req), "deliver")
	deliver.End()

	got := spans.GetSpans()
	require.Len(t, got, 4)
	want := trace.SpanContextFromContext(tracing.ExtractHTTP(context.Background(), http.Header{"Traceparent": {incoming}}))
	parent := want.SpanID()
	for i, name := range []string{"receive", "publish", "consume", "deliver"} {
		s := got[i]
		require.Equal(t, name, s.Name)
		require.Equal(t, want.TraceID(), s.SpanContext.TraceID(), name)
		require.Equal(t, parent, s.Parent.SpanID(), "%s is the child of the previous hop", name)
		require.True(t, s.Parent.IsRemote(), name)
		parent = s.SpanContext.SpanID()
	}
}

// TestExtractWithoutContext: a message without traceparent starts no remote context, and
// injecting without a span context adds nothing.
func TestExtractWithoutContext(t *testing.T) {
	t.Parallel()
	ctx := tracing.ExtractKafka(context.Background(), []kafka.Header{{Key: "operation-id", Value: []byte("x")}})
	require.False(t, trace.SpanContextFromContext(ctx).IsValid())
	require.Len(t, tracing.InjectKafka(ctx, []kafka.Header{{Key: "a"}}), 1)
	m := map[string]string{}
	tracing.InjectMap(ctx, m)
	require.Empty(t, m)
	ctx = tracing.ExtractHTTP(context.Background(), http.Header{"Traceparent": {"garbage"}})
	require.False(t, trace.SpanContextFromContext(ctx).IsValid(), "a malformed traceparent is ignored")
}

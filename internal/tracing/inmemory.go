package tracing

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemd/idemd/internal/testsignal"
)

// InMemory returns a tracer provider that records every span, synchronously, into the
// in-memory exporter it returns: for tests that check which spans a flow produced and how
// they link. Give the provider to the components under test (their config), rather than
// installing it globally, so that parallel tests do not see each other's spans.
//
// Processors given run after the exporter has the span (an Ended signal, say).
func InMemory(processors ...sdktrace.SpanProcessor) (*sdktrace.TracerProvider, *tracetest.InMemoryExporter) {
	exporter := tracetest.NewInMemoryExporter()
	opts := []sdktrace.TracerProviderOption{sdktrace.WithSyncer(exporter), sdktrace.WithSampler(sdktrace.AlwaysSample())}
	for _, p := range processors {
		opts = append(opts, sdktrace.WithSpanProcessor(p))
	}
	return sdktrace.NewTracerProvider(opts...), exporter
}

// Ended is a span processor that signals the name of each span that ends, so that a test
// waits for a span (a consumer's, at the end of a flow) rather than polling the exporter.
// Init its Signal before the spans start.
type Ended struct {
	testsignal.Signal[string]
}

func (e *Ended) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (e *Ended) OnEnd(s sdktrace.ReadOnlySpan)                   { e.Signal.Signal(s.Name()) }
func (e *Ended) Shutdown(context.Context) error                  { return nil }
func (e *Ended) ForceFlush(context.Context) error                { return nil }

// Named returns the recorded spans called name, in the order they ended (tests).
func Named(spans tracetest.SpanStubs, name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// Attr returns the value of attribute key of a recorded span, as text, and whether it has
// it (tests).
func Attr(s tracetest.SpanStub, key attribute.Key) (string, bool) {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.Value.String(), true
		}
	}
	return "", false
}

// Texts returns everything a recorded span says in words — its name, its attributes'
// values, its events' names and attributes, its status — for tests that check what a span
// must never hold (a payload, a secret).
func Texts(s tracetest.SpanStub) []string {
	out := []string{s.Name, s.Status.Description}
	for _, kv := range s.Attributes {
		out = append(out, string(kv.Key)+"="+kv.Value.String())
	}
	for _, e := range s.Events {
		out = append(out, e.Name)
		for _, kv := range e.Attributes {
			out = append(out, string(kv.Key)+"="+kv.Value.String())
		}
	}
	return out
}

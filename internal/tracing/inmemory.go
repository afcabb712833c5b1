package tracing

import (
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// InMemory returns a tracer provider that records every span, synchronously, into the
// in-memory exporter it returns: for tests that check which spans a flow produced and how
// they link. Give the provider to the components under test (their config), rather than
// installing it globally, so that parallel tests do not see each other's spans.
func InMemory() (*sdktrace.TracerProvider, *tracetest.InMemoryExporter) {
	exporter := tracetest.NewInMemoryExporter()
	provider := sdktrace.NewTracerProvider(
		sdktrace.WithSyncer(exporter),
		sdktrace.WithSampler(sdktrace.AlwaysSample()),
	)
	return provider, exporter
}

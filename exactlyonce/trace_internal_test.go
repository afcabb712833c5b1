package exactlyonce

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/idemd/idemd/internal/tracing"
	"github.com/idemd/idemd/outbox"
)

// TestTraceOffAllocatesNothing: with tracing off — a no-op provider, or OpenTelemetry's
// global one while nothing is installed — the unit's tracing steps for a message without
// a trace context allocate nothing. Not parallel: AllocsPerRun counts the whole process.
func TestTraceOffAllocatesNothing(t *testing.T) {
	for name, provider := range map[string]trace.TracerProvider{"noop": noop.NewTracerProvider(), "global, unset": nil} {
		u := &Unit{tracer: tracing.NewTracer(provider, tracerScope)}
		m := &Message{Scope: "s", ID: "1", Effect: Effect{SQL: "SELECT 1"}}
		msgs := []*Message{m}
		events := []outbox.Event{{Topic: "t", Pipeline: "s", CausationID: "1"}}
		q := &queue{}
		ctx := context.Background()
		allocs := testing.AllocsPerRun(100, func() {
			tctx, span := u.startTx(ctx, msgs)
			mctx := messageContext(tctx, m)
			finish(q, u.startEffect(mctx, m), nil)
			s, _ := u.startEnqueue(mctx, m, events)
			finish(q, s, nil)
			q.endSpans(nil)
			tracing.End(span, nil)
		})
		require.Zero(t, allocs, name)
	}
}

package consumer_test

import (
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/idemd/idemd/internal/tracing"
	"github.com/idemd/idemd/pipeline"
)

// tracedRecords produces three records on partition 0 — two carrying a traceparent of
// traces of their own, one without — and returns their traceparents by message id.
func tracedRecords(t *testing.T, b *bundle) map[string]string {
	t.Helper()
	parents := map[string]string{
		"t1": "00-11111111111111111111111111111111-1111111111111111-01",
		"t2": "00-22222222222222222222222222222222-2222222222222222-01",
		"t3": "",
	}
	var msgs []kafka.Message
	for _, id := range []string{"t1", "t2", "t3"} {
		m := msg(id, 0, `{"id":"`+id+`","card":"4242-secret"}`)
		if parents[id] != "" {
			m.Headers = append(m.Headers, kafka.Header{Key: "traceparent", Value: []byte(parents[id])})
		}
		msgs = append(msgs, m)
	}
	produce(t, b.brokers, b.topic, msgs...)
	return parents
}

func (b *bundle) storedTraceparent(t *testing.T, id string) string {
	t.Helper()
	return b.db.Text(t, `SELECT headers->>'traceparent' FROM {schema}.outbox WHERE causation_id = $1`, id)
}

// TestTraceOfRecords: each record gets a consumer span continuing the traceparent it
// carries, with the messaging conventions' attributes and its outcome; the unit's spans of
// each record stay in its trace, and the event it publishes stores that trace. Values are
// in no span.
func TestTraceOfRecords(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	parents := tracedRecords(t, b)
	provider, exporter := tracing.InMemory()
	cfg := b.config()
	cfg.Publish = pipeline.Targets{{Topic: "ledger.out"}}
	cfg.TracerProvider = provider
	start(t, b.db, cfg)
	b.waitCommitted(t, 60*time.Second, func(offs []int64) bool { return offs[0] == 3 })

	spans := exporter.GetSpans()
	process := map[string]tracetest.SpanStub{}
	for _, s := range tracing.Named(spans, "process "+b.topic) {
		id, _ := tracing.Attr(s, tracing.AttrMessageID)
		process[id] = s
		require.Equal(t, trace.SpanKindConsumer, s.SpanKind)
		for key, want := range map[string]string{
			"messaging.system": "kafka", "messaging.operation.type": "process", "messaging.destination.name": b.topic,
			"messaging.destination.partition.id": "0", "messaging.consumer.group.name": b.group,
			"idemd.pipeline": "ledger", "idemd.outcome": "applied",
		} {
			got, _ := tracing.Attr(s, attribute.Key(key))
			require.Equal(t, want, got, key)
		}
		require.NotContains(t, strings.Join(tracing.Texts(s), " "), "4242-secret")
	}
	require.Len(t, process, 3)
	for id, parent := range parents {
		s := process[id]
		if parent == "" {
			require.False(t, s.Parent.IsValid(), "%s started its own trace", id)
			continue
		}
		require.Equal(t, parent[3:35], s.SpanContext.TraceID().String(), id)
		require.Equal(t, parent[36:52], s.Parent.SpanID().String(), id)
		require.True(t, s.Parent.IsRemote())
	}
	for _, name := range []string{"idemd.effect", "enqueue ledger.out"} {
		for _, s := range tracing.Named(spans, name) {
			id, _ := tracing.Attr(s, tracing.AttrMessageID)
			require.Equal(t, process[id].SpanContext.TraceID(), s.SpanContext.TraceID(), "%s of %s is in its record's trace", name, id)
		}
	}
	for id := range parents {
		enqueue := tracing.Named(spans, "enqueue ledger.out")
		var stored string
		for _, s := range enqueue {
			if got, _ := tracing.Attr(s, tracing.AttrMessageID); got == id {
				stored = "00-" + s.SpanContext.TraceID().String() + "-" + s.SpanContext.SpanID().String() + "-01"
			}
		}
		require.Equal(t, stored, b.storedTraceparent(t, id), id)
	}
}

// TestTraceOffPassesTheRecordsTraceOn: with tracing off, the published event stores the
// record's traceparent as it came.
func TestTraceOffPassesTheRecordsTraceOn(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	parents := tracedRecords(t, b)
	cfg := b.config()
	cfg.Publish = pipeline.Targets{{Topic: "ledger.out"}}
	cfg.TracerProvider = noop.NewTracerProvider()
	start(t, b.db, cfg)
	b.waitCommitted(t, 60*time.Second, func(offs []int64) bool { return offs[0] == 3 })
	for id, parent := range parents {
		require.Equal(t, parent, b.storedTraceparent(t, id), id)
	}
}

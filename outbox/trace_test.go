package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemd/idemd/internal/kafkatest"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/internal/tracing"
	"github.com/idemd/idemd/outbox"
)

// TestRelayTrace: each record carries the traceparent stored with its row, unchanged, so
// that its consumer continues the trace of the transaction that wrote it; the relay's send
// span of a batch links to those contexts, and the send of one traced record is its child.
func TestRelayTrace(t *testing.T) {
	t.Parallel()
	b := setupRelay(t, 1, pgtest.Options{})
	provider, exporter := tracing.InMemory()
	parents := []string{
		"00-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-a1a1a1a1a1a1a1a1-01",
		"00-bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb-b1b1b1b1b1b1b1b1-01",
		"",
	}
	events := b.events(3, "traced")
	for i, tp := range parents {
		if tp != "" {
			events[i].Headers = map[string]string{"traceparent": tp}
		}
	}
	b.enqueue(t, events...)
	r, _ := b.startRelay(t, outbox.RelayConfig{TracerProvider: provider})
	b.drain(t, r, 30*time.Second)

	records := kafkatest.ReadAll(t, b.topic, 3, 30*time.Second)
	for i, m := range records {
		require.Equal(t, parents[i], kafkatest.Header(m, "traceparent"), "record %d carries its row's trace context", i)
	}
	sends := tracing.Named(exporter.GetSpans(), "send "+b.topic)
	require.Len(t, sends, 1)
	s := sends[0]
	require.Equal(t, trace.SpanKindProducer, s.SpanKind)
	for key, want := range map[string]string{
		"messaging.system": "kafka", "messaging.operation.type": "send", "messaging.destination.name": b.topic,
		"messaging.batch.message_count": "3",
	} {
		got, _ := tracing.Attr(s, attribute.Key(key))
		require.Equal(t, want, got, key)
	}
	var linked []string
	for _, l := range s.Links {
		linked = append(linked, "00-"+l.SpanContext.TraceID().String()+"-"+l.SpanContext.SpanID().String()+"-01")
	}
	require.ElementsMatch(t, parents[:2], linked)

	// One traced record: the send is a child of the context stored with it.
	exporter.Reset()
	one := b.events(1, "single")
	one[0].Headers = map[string]string{"traceparent": "00-cccccccccccccccccccccccccccccccc-c1c1c1c1c1c1c1c1-01"}
	b.enqueue(t, one...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, r.Drain(ctx))
	sends = tracing.Named(exporter.GetSpans(), "send "+b.topic)
	require.Len(t, sends, 1)
	require.Equal(t, "cccccccccccccccccccccccccccccccc", sends[0].SpanContext.TraceID().String())
	require.Equal(t, "c1c1c1c1c1c1c1c1", sends[0].Parent.SpanID().String())
	op, _ := tracing.Attr(sends[0], tracing.AttrOperationID)
	require.Equal(t, outbox.OperationID("p", "single-0", 0).String(), op)
}

// TestEnqueueTxStoresTheCallersTrace: an event enqueued within a span stores that span's
// context; an event with a traceparent of its own keeps it; without a span nothing is
// added.
func TestEnqueueTxStoresTheCallersTrace(t *testing.T) {
	t.Parallel()
	b := setupRelay(t, 1, pgtest.Options{})
	provider, _ := tracing.InMemory()
	ctx, span := provider.Tracer("test").Start(context.Background(), "handler")
	defer span.End()
	own := "00-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-a1a1a1a1a1a1a1a1-01"
	events := b.events(2, "enq")
	events[1].Headers = map[string]string{"traceparent": own}
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, b.store.EnqueueTx(ctx, tx, events...))
	require.NoError(t, b.store.EnqueueTx(context.Background(), tx, b.events(1, "bare")...))
	require.NoError(t, tx.Commit(ctx))
	stored := func(id string) string {
		return b.db.Text(t, `SELECT headers->>'traceparent' FROM {schema}.outbox WHERE causation_id = $1`, id)
	}
	sc := span.SpanContext()
	require.Equal(t, "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-01", stored("enq-0"))
	require.Equal(t, own, stored("enq-1"))
	require.Empty(t, stored("bare-0"))
	require.Nil(t, events[0].Headers, "the caller's events are not changed")
}

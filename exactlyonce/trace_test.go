package exactlyonce_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/idemd/idemd/exactlyonce"
	"github.com/idemd/idemd/internal/tracing"
	"github.com/idemd/idemd/outbox"
)

// remote is the trace context a door hands over: a span of another process.
func remote(t *testing.T, traceID, spanID string) trace.SpanContext {
	t.Helper()
	tid, err := trace.TraceIDFromHex(traceID)
	require.NoError(t, err)
	sid, err := trace.SpanIDFromHex(spanID)
	require.NoError(t, err)
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true})
}

// traceparent is the W3C header of sc.
func traceparent(sc trace.SpanContext) string {
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"
}

// tracedMessage is a message of scope "s" whose effect inserts (id, n), publishing one
// event with a secret-looking payload, in trace sc.
func (b *bundle) tracedMessage(id string, n int, sc trace.SpanContext) *exactlyonce.Message {
	m := b.msg(id, n)
	m.Answer = nil
	m.Trace = sc
	m.Events = []exactlyonce.Event{{Event: outbox.Event{
		Topic: "out", Pipeline: "s", CausationID: id, Payload: []byte(`{"card":"4242-secret"}`),
		Headers: map[string]string{outbox.HeaderContentType: "application/json"},
	}}}
	return m
}

// storedTraceparent reads the traceparent stored with the outbox row of message id.
func (b *bundle) storedTraceparent(t *testing.T, id string) string {
	t.Helper()
	return b.db.Text(t, `SELECT headers->>'traceparent' FROM {schema}.outbox WHERE causation_id = $1`, id)
}

func tracedUnit(t *testing.T, b *bundle) *tracetest.InMemoryExporter {
	t.Helper()
	provider, spans := tracing.InMemory()
	b.unit = newUnit(t, b.db, b.db.Pool, func(c *exactlyonce.Config) { c.TracerProvider = provider })
	return spans
}

// TestTraceOfOneMessage: the transaction of one message is a child of the message's trace
// context; its effect and enqueue spans are children of the transaction; the outbox row
// stores the enqueue span's context, which the relay's record will carry. No span holds the
// payload.
func TestTraceOfOneMessage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	exporter := tracedUnit(t, b)
	in := remote(t, "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")
	m := b.tracedMessage("a", 1, in)
	require.NoError(t, b.unit.Apply(context.Background(), []*exactlyonce.Message{m}))

	spans := exporter.GetSpans()
	tx := tracing.Named(spans, "idemd.transaction")
	require.Len(t, tx, 1)
	require.Equal(t, in.TraceID(), tx[0].SpanContext.TraceID())
	require.Equal(t, in.SpanID(), tx[0].Parent.SpanID())
	for _, name := range []string{"idemd.effect", "enqueue out"} {
		s := tracing.Named(spans, name)
		require.Len(t, s, 1, name)
		require.Equal(t, tx[0].SpanContext.SpanID(), s[0].Parent.SpanID(), "%s is a child of the transaction", name)
		require.Equal(t, in.TraceID(), s[0].SpanContext.TraceID())
		id, _ := tracing.Attr(s[0], tracing.AttrMessageID)
		require.Equal(t, "a", id)
	}
	enqueue := tracing.Named(spans, "enqueue out")[0]
	require.Equal(t, trace.SpanKindProducer, enqueue.SpanKind)
	op, _ := tracing.Attr(enqueue, tracing.AttrOperationID)
	require.Equal(t, outbox.OperationID("s", "a", 0).String(), op)
	require.Equal(t, traceparent(enqueue.SpanContext), b.storedTraceparent(t, "a"),
		"the row carries the enqueue span's context")
	require.Empty(t, m.Events[0].Headers["traceparent"], "the message's own event is not changed")
	for _, s := range spans {
		require.NotContains(t, strings.Join(tracing.Texts(s), " "), "4242-secret")
	}
}

// TestTraceOfABatch: a batch's transaction links to each message's trace context; each
// message's spans stay in its own trace, linked to the transaction, and its row stores its
// own trace. A message without a trace context gets its spans under the transaction.
func TestTraceOfABatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	exporter := tracedUnit(t, b)
	ta := remote(t, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "a1a1a1a1a1a1a1a1")
	tb := remote(t, "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb", "b1b1b1b1b1b1b1b1")
	ma, mb, mc := b.tracedMessage("a", 1, ta), b.tracedMessage("b", 2, tb), b.tracedMessage("c", 3, trace.SpanContext{})
	require.NoError(t, b.unit.Apply(context.Background(), []*exactlyonce.Message{ma, mb, mc}))

	spans := exporter.GetSpans()
	tx := tracing.Named(spans, "idemd.transaction")
	require.Len(t, tx, 1)
	require.False(t, tx[0].Parent.IsValid(), "a batch is no one message's child")
	var linked []trace.SpanContext
	for _, l := range tx[0].Links {
		linked = append(linked, l.SpanContext)
	}
	require.ElementsMatch(t, []trace.SpanContext{ta, tb}, linked)
	size, _ := tracing.Attr(tx[0], tracing.AttrBatchSize)
	require.Equal(t, "3", size)

	byMessage := map[string][]tracetest.SpanStub{}
	for _, s := range spans {
		if id, ok := tracing.Attr(s, tracing.AttrMessageID); ok && s.Name != "idemd.transaction" {
			byMessage[id] = append(byMessage[id], s)
		}
	}
	for id, in := range map[string]trace.SpanContext{"a": ta, "b": tb} {
		require.Len(t, byMessage[id], 2, "effect and enqueue of %s", id)
		for _, s := range byMessage[id] {
			require.Equal(t, in.TraceID(), s.SpanContext.TraceID(), "%s %s stays in its message's trace", id, s.Name)
			require.Equal(t, in.SpanID(), s.Parent.SpanID())
			require.Len(t, s.Links, 1)
			require.Equal(t, tx[0].SpanContext, s.Links[0].SpanContext, "linked to the transaction")
		}
		enqueue := tracing.Named(byMessage[id], "enqueue out")
		require.Len(t, enqueue, 1)
		require.Equal(t, traceparent(enqueue[0].SpanContext), b.storedTraceparent(t, id))
	}
	for _, s := range byMessage["c"] {
		require.Equal(t, tx[0].SpanContext.SpanID(), s.Parent.SpanID(), "without its own trace, under the transaction")
		require.Empty(t, s.Links)
	}
}

// TestTraceRecordsRetriesAndFailures: a transient failure is an event of the transaction
// span; a permanently failing effect's spans are marked failed with the SQLSTATE, never the
// database's message (which quotes the refused value).
func TestTraceRecordsRetriesAndFailures(t *testing.T) {
	t.Parallel()
	b := setup(t)
	exporter := tracedUnit(t, b)
	var calls atomic.Int32
	flaky := b.tracedMessage("flaky", 1, trace.SpanContext{})
	flaky.Effect.Func = func(ctx context.Context, tx pgx.Tx) (any, error) {
		if calls.Add(1) == 1 {
			return nil, &pgconn.PgError{Code: "40001", Message: "could not serialize access"}
		}
		return nil, nil
	}
	poison := b.tracedMessage("poison", -1, trace.SpanContext{})
	poison.MaxAttempts = 2
	require.NoError(t, b.unit.Apply(context.Background(), []*exactlyonce.Message{flaky, poison}))
	require.Equal(t, exactlyonce.DeadLettered, poison.Outcome)

	spans := exporter.GetSpans()
	tx := tracing.Named(spans, "idemd.transaction")
	require.Len(t, tx, 1)
	var events []string
	for _, e := range tx[0].Events {
		events = append(events, e.Name)
	}
	require.Contains(t, events, "retry")
	require.Contains(t, events, "savepoints")
	failed := 0
	for _, s := range tracing.Named(spans, "idemd.effect") {
		if id, _ := tracing.Attr(s, tracing.AttrMessageID); id == "poison" && s.Status.Code == codes.Error {
			failed++
			typ, _ := tracing.Attr(s, "error.type")
			require.Equal(t, "23514", typ)
			require.NotContains(t, strings.Join(tracing.Texts(s), " "), "violates")
		}
	}
	require.GreaterOrEqual(t, failed, 2, "each failed run of the poison message")
}

// TestTraceOffPassesTheContextOn: with tracing off (a no-op provider), nothing is recorded,
// and the row stores the message's own trace context unchanged, so that a traced sender's
// trace goes on downstream; a message without one stores none.
func TestTraceOffPassesTheContextOn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.unit = newUnit(t, b.db, b.db.Pool, func(c *exactlyonce.Config) { c.TracerProvider = noop.NewTracerProvider() })
	in := remote(t, "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")
	msgs := []*exactlyonce.Message{b.tracedMessage("a", 1, in), b.tracedMessage("b", 2, trace.SpanContext{})}
	require.NoError(t, b.unit.Apply(context.Background(), msgs))
	require.Equal(t, traceparent(in), b.storedTraceparent(t, "a"))
	require.Empty(t, b.storedTraceparent(t, "b"))
}

func TestDestinationNames(t *testing.T) {
	t.Parallel()
	b := setup(t)
	exporter := tracedUnit(t, b)
	m := b.tracedMessage("multi", 1, trace.SpanContext{})
	m.Events = append(m.Events, exactlyonce.Event{Event: outbox.Event{Endpoint: "hooks", Pipeline: "s", CausationID: "multi", OperationID: outbox.OperationID("s", "multi", 1)}})
	require.NoError(t, b.unit.Apply(context.Background(), []*exactlyonce.Message{m}))
	s := tracing.Named(exporter.GetSpans(), "enqueue outbox")
	require.Len(t, s, 1, fmt.Sprint(exporter.GetSpans()))
	n, _ := tracing.Attr(s[0], "messaging.batch.message_count")
	require.Equal(t, "2", n)
}

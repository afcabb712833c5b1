package exactlyonce

import (
	"context"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemd/idemd/internal/tracing"
	"github.com/idemd/idemd/outbox"
	"github.com/idemd/idemd/processed"
)

// The unit's spans (OpenTelemetry): a transaction span per Apply (or ApplyReserved), and
// under it, per message, an effect span per run of its effect and an enqueue span for the
// events it writes to the outbox. A transaction of one message is a child of the message's
// trace context (Message.Trace); a batch's transaction links to each message's context, and
// each message's spans stay in the message's own trace, linked to the transaction. The
// events carry the trace context of their enqueue span in their traceparent header (stored
// with the outbox row), so that the relay's record and the HTTP delivery continue the
// message's trace; with tracing off they carry Message.Trace unchanged. With tracing off
// nothing here allocates.

const tracerScope = "github.com/idemd/idemd/exactlyonce"

// txLink, in a batch transaction's context, holds the transaction span's context, which
// each message's spans link to.
type txLink struct{}

// startTx starts the transaction span of msgs.
func (u *Unit) startTx(ctx context.Context, msgs []*Message) (context.Context, trace.Span) {
	tr, ok := u.tracer.Get()
	if !ok {
		return ctx, nil
	}
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(semconv.DBSystemNamePostgreSQL, tracing.AttrBatchSize.Int(len(msgs))),
	}
	if len(msgs) == 1 {
		m := msgs[0]
		ctx = tracing.Parent(ctx, m.Trace)
		opts = append(opts, trace.WithAttributes(messageAttrs(m)...))
		return tr.Start(ctx, "idemd.transaction", opts...)
	}
	scs := make([]trace.SpanContext, len(msgs))
	for i, m := range msgs {
		scs[i] = m.Trace
	}
	opts = append(opts, trace.WithLinks(tracing.Links(scs)...))
	ctx, span := tr.Start(ctx, "idemd.transaction", opts...)
	return context.WithValue(ctx, txLink{}, span.SpanContext()), span
}

// messageContext is the context of m's spans: in a batch, m's own trace context (its
// spans link to the transaction); alone, the transaction's.
func messageContext(ctx context.Context, m *Message) context.Context {
	if !m.Trace.IsValid() || ctx.Value(txLink{}) == nil {
		return ctx
	}
	return trace.ContextWithRemoteSpanContext(ctx, m.Trace)
}

// startSpan starts one of a message's spans in ctx (messageContext), linked to the batch's
// transaction when it is not its parent.
func (u *Unit) startSpan(ctx context.Context, tr trace.Tracer, name string, kind trace.SpanKind, m *Message) trace.Span {
	opts := []trace.SpanStartOption{trace.WithSpanKind(kind), trace.WithAttributes(messageAttrs(m)...)}
	if tx, ok := ctx.Value(txLink{}).(trace.SpanContext); ok && !trace.SpanContextFromContext(ctx).Equal(tx) {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: tx}))
	}
	_, span := tr.Start(ctx, name, opts...)
	return span
}

// startEffect starts the span of one run of m's effect; nil when tracing is off.
func (u *Unit) startEffect(ctx context.Context, m *Message) trace.Span {
	tr, ok := u.tracer.Get()
	if !ok {
		return nil
	}
	span := u.startSpan(ctx, tr, "idemd.effect", trace.SpanKindInternal, m)
	span.SetAttributes(tracing.AttrAttempt.Int(max(m.Attempts, 1)))
	if m.Effect.SQL != "" {
		span.SetAttributes(semconv.DBSystemNamePostgreSQL)
	}
	return span
}

// startEnqueue starts the span of m's outbox enqueue and returns events carrying its trace
// context (copies: the message's own events are not changed). With tracing off, the span is
// nil and the events carry m.Trace, when there is one.
func (u *Unit) startEnqueue(ctx context.Context, m *Message, events []outbox.Event) (trace.Span, []outbox.Event) {
	sc := m.Trace
	var span trace.Span
	if tr, ok := u.tracer.Get(); ok {
		dest := destination(events)
		span = u.startSpan(ctx, tr, "enqueue "+dest, trace.SpanKindProducer, m)
		span.SetAttributes(
			semconv.MessagingOperationTypeCreate, semconv.MessagingOperationName("enqueue"),
			semconv.MessagingSystemKey.String("idemd_outbox"), semconv.MessagingDestinationName(dest),
		)
		if len(events) == 1 {
			op := events[0].OperationID
			if op == uuid.Nil {
				op = outbox.OperationID(events[0].Pipeline, events[0].CausationID, 0)
			}
			span.SetAttributes(tracing.AttrOperationID.String(op.String()))
		} else {
			span.SetAttributes(semconv.MessagingBatchMessageCount(len(events)))
		}
		sc = span.SpanContext()
	}
	if sc.IsValid() {
		for i := range events {
			events[i].Headers = tracing.WithContext(events[i].Headers, sc)
		}
	}
	return span, events
}

// destination names where events go: the topic (or HTTP endpoint) they share, else
// "outbox".
func destination(events []outbox.Event) string {
	name := ""
	for _, e := range events {
		d := e.Topic
		if d == "" {
			d = e.Endpoint
		}
		if name != "" && d != name {
			return "outbox"
		}
		name = d
	}
	if name == "" {
		return "outbox"
	}
	return name
}

func messageAttrs(m *Message) []attribute.KeyValue {
	pipeline, _ := processed.ScopeTenant(m.Scope)
	return []attribute.KeyValue{tracing.AttrPipeline.String(pipeline), tracing.AttrMessageID.String(m.ID)}
}

// finish ends span when err is set or nothing is queued (q direct); a span of a queued
// statement ends when the queue is sent.
func finish(q *queue, span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil || q.direct {
		tracing.End(span, err)
		return
	}
	q.spans = append(q.spans, span)
}

// endSpans ends the spans of what q sent (or dropped, with err).
func (q *queue) endSpans(err error) {
	if q == nil {
		return
	}
	for _, s := range q.spans {
		tracing.End(s, err)
	}
	q.spans = q.spans[:0]
}

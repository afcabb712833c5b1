package outbox

import (
	"context"
	"slices"

	"github.com/segmentio/kafka-go"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemd/idemd/internal/tracing"
)

// The outbox's part of tracing (OpenTelemetry). Each row stores the trace context of what
// enqueued it (its traceparent header: the unit of work's enqueue span, or for EnqueueTx
// callers the span of their ctx), and the record the relay publishes carries it unchanged,
// so the consumer of the record continues the trace of the transaction that wrote the row.
// The relay's span: one "send {topic}" producer span per write to Kafka, with the messaging
// semantic conventions' attributes, linked to the records' contexts (a send of one traced
// record is its child). With tracing off nothing here allocates.

const relayTracerScope = "github.com/idemd/idemd/outbox"

// write publishes msgs, all of topic, in a send span.
func (r *Relay) write(ctx context.Context, topic string, msgs []kafka.Message) error {
	tr, ok := r.tracer.Get()
	if !ok {
		return r.writer.WriteMessages(ctx, msgs...)
	}
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			semconv.MessagingSystemKafka, semconv.MessagingOperationTypeSend, semconv.MessagingOperationName("send"),
			semconv.MessagingDestinationName(topic),
		),
	}
	sctx := ctx
	if len(msgs) == 1 {
		sctx = tracing.Parent(ctx, tracing.FromKafka(msgs[0].Headers))
		for _, h := range msgs[0].Headers {
			if h.Key == HeaderOperationID {
				opts = append(opts, trace.WithAttributes(tracing.AttrOperationID.String(string(h.Value))))
			}
		}
	} else {
		scs := make([]trace.SpanContext, len(msgs))
		for i := range msgs {
			scs[i] = tracing.FromKafka(msgs[i].Headers)
		}
		opts = append(opts, trace.WithLinks(tracing.Links(scs)...),
			trace.WithAttributes(semconv.MessagingBatchMessageCount(len(msgs))))
	}
	_, span := tr.Start(sctx, "send "+topic, opts...)
	err := r.writer.WriteMessages(ctx, msgs...)
	tracing.End(span, err)
	return err
}

// withTrace returns events with ctx's trace context as the traceparent of those that have
// none (copies); events as they are when ctx has no span.
func withTrace(ctx context.Context, events []Event) []Event {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return events
	}
	out := slices.Clone(events)
	for i := range out {
		if out[i].Headers["traceparent"] == "" {
			out[i].Headers = tracing.WithContext(out[i].Headers, sc)
		}
	}
	return out
}

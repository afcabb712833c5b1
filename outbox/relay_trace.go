package outbox

import (
	"context"

	"github.com/segmentio/kafka-go"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemd/idemd/internal/tracing"
)

// The relay's span (OpenTelemetry): one "send {topic}" producer span per write to Kafka,
// with the messaging semantic conventions' attributes. Each record carries, unchanged, the
// trace context stored with its row (its traceparent header, set by whoever enqueued it:
// the unit of work's enqueue span), so the consumer of the record continues the trace of
// the transaction that wrote it. The send span links to those contexts; a send of one
// traced record is a child of its context. With tracing off nothing here allocates.

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

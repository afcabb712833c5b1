package outbox

import (
	"context"
	"slices"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemd/idemd/internal/tracing"
)

// The outbox's part of tracing (OpenTelemetry). Each row stores the trace context of what
// enqueued it (its traceparent header: the unit of work's enqueue span, or for EnqueueTx
// callers the span of their ctx), and the record or message the relay publishes carries it
// unchanged (a Kafka header, a Pub/Sub or SQS attribute), so the consumer of the record
// continues the trace of the transaction that wrote the row. The relay's span: one "send
// {destination}" producer span per publish of a destination's rows, with the messaging
// semantic conventions' attributes (messaging.system kafka, gcp_pubsub or aws_sqs; the
// destination's name as the broker knows it), linked to the rows' contexts (a send of one
// traced row is its child). With tracing off nothing here allocates.

const relayTracerScope = "github.com/idemd/idemd/outbox"

// messagingSystem is the messaging.system of each kind of destination.
var messagingSystem = map[string]attribute.KeyValue{
	DestinationKafka:  semconv.MessagingSystemKafka,
	DestinationPubSub: semconv.MessagingSystemGCPPubSub,
	DestinationSQS:    semconv.MessagingSystemAWSSQS,
}

// send publishes b's rows with its outlet, in a send span, and returns one outcome per row.
func (r *Relay) send(ctx context.Context, b *batch) []error {
	tr, ok := r.tracer.Get()
	if !ok {
		return b.out.publish(ctx, b)
	}
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			messagingSystem[b.kind], semconv.MessagingOperationTypeSend, semconv.MessagingOperationName("send"),
			semconv.MessagingDestinationName(b.name),
		),
	}
	sctx := ctx
	if len(b.events) == 1 {
		sctx = tracing.Parent(ctx, tracing.FromMap(b.events[0].Headers))
		opts = append(opts, trace.WithAttributes(tracing.AttrOperationID.String(opID(&b.events[0]))))
	} else {
		scs := make([]trace.SpanContext, len(b.events))
		for i := range b.events {
			scs[i] = tracing.FromMap(b.events[i].Headers)
		}
		opts = append(opts, trace.WithLinks(tracing.Links(scs)...),
			trace.WithAttributes(semconv.MessagingBatchMessageCount(len(b.events))))
	}
	_, span := tr.Start(sctx, "send "+b.name, opts...)
	errs := b.out.publish(ctx, b)
	tracing.End(span, firstError(errs))
	return errs
}

// firstError is the first non-nil error of errs: a span records the publish as failed when
// any event failed.
func firstError(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
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

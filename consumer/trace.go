package consumer

import (
	"context"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemd/idemd/exactlyonce"
	"github.com/idemd/idemd/internal/tracing"
)

// The consumer's spans (OpenTelemetry): one "process {topic}" consumer span per record, a
// child of the trace context the record carries (its traceparent header; on Pub/Sub and
// SQS, its traceparent attribute), from the moment it was fetched until its batch
// committed, with the messaging semantic conventions' attributes (messaging.system kafka,
// gcp_pubsub or aws_sqs; messaging.destination.name the topic, subscription or queue) and
// idemd's (pipeline, message id, outcome). Record keys, values, headers and attributes are
// never recorded. The record's message carries the span's context into the unit of
// work; with tracing off it carries the record's traceparent, so that the trace goes on
// downstream.
//
// The trace context is read from the record's headers map (Message.Headers), so a door
// whose attributes are mapped into it (Pub/Sub, SQS) continues traces the same way.

const tracerScope = "github.com/idemd/idemd/consumer"

// startRecords gives each message its trace context and starts its record's span; it
// returns the spans, or nil when tracing is off.
func (c *Consumer) startRecords(batch []*record, msgs []*exactlyonce.Message) []trace.Span {
	tr, ok := c.tracer.Get()
	if !ok {
		for i, r := range batch {
			msgs[i].Trace = r.traceContext()
		}
		return nil
	}
	spans := make([]trace.Span, len(batch))
	for i, r := range batch {
		ctx := tracing.Parent(context.Background(), r.traceContext())
		attrs := []attribute.KeyValue{
			semconv.MessagingOperationTypeProcess, semconv.MessagingOperationName("process"),
			semconv.MessagingDestinationName(r.msg.Topic), semconv.MessagingMessageBodySize(len(r.msg.Value)),
			tracing.AttrPipeline.String(c.cfg.Name), tracing.AttrMessageID.String(msgs[i].ID),
		}
		switch r.msg.Door {
		case DoorKafka:
			attrs = append(attrs, semconv.MessagingSystemKafka, semconv.MessagingConsumerGroupName(c.cfg.Group),
				semconv.MessagingDestinationPartitionID(strconv.Itoa(r.msg.Partition)), semconv.MessagingKafkaOffset(int(r.msg.Offset)))
		case DoorPubSub:
			attrs = append(attrs, semconv.MessagingSystemGCPPubSub, semconv.MessagingDestinationSubscriptionName(r.msg.Topic),
				semconv.MessagingMessageID(r.msg.BrokerID))
			if r.msg.DeliveryAttempt > 0 {
				attrs = append(attrs, semconv.MessagingGCPPubSubMessageDeliveryAttempt(r.msg.DeliveryAttempt))
			}
		case DoorSQS:
			attrs = append(attrs, semconv.MessagingSystemAWSSQS, semconv.MessagingMessageID(r.msg.BrokerID))
		}
		_, spans[i] = tr.Start(ctx, "process "+r.msg.Topic,
			trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithTimestamp(r.msg.ReceivedAt),
			trace.WithAttributes(attrs...))
		msgs[i].Trace = spans[i].SpanContext()
	}
	return spans
}

// endRecords ends the records' spans with their messages' outcomes, or err.
func endRecords(spans []trace.Span, msgs []*exactlyonce.Message, err error) {
	for i, span := range spans {
		if err == nil {
			span.SetAttributes(tracing.AttrOutcome.String(msgs[i].Outcome.String()))
		}
		tracing.End(span, err)
	}
}

// traceContext is the trace context of the record's traceparent (and tracestate) header or
// attribute; the headers' map is made only for a record that has one.
func (r *record) traceContext() trace.SpanContext {
	if tp, _ := r.header("traceparent"); tp == "" {
		return trace.SpanContext{}
	}
	return tracing.FromMap(r.headers())
}

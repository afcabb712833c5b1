package tracing

import (
	"context"
	"net/http"
	"strings"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Propagator carries W3C Trace Context: the traceparent and tracestate headers (or
// attributes). It is idemd's one propagation format, whatever the transport.
var Propagator propagation.TextMapPropagator = propagation.TraceContext{}

// ExtractHTTP returns ctx with the remote span context of h's traceparent, if any.
func ExtractHTTP(ctx context.Context, h http.Header) context.Context {
	return Propagator.Extract(ctx, propagation.HeaderCarrier(h))
}

// InjectHTTP sets h's traceparent (and tracestate) to ctx's span context, if any.
func InjectHTTP(ctx context.Context, h http.Header) {
	Propagator.Inject(ctx, propagation.HeaderCarrier(h))
}

// ExtractKafka returns ctx with the remote span context of a record's traceparent header.
func ExtractKafka(ctx context.Context, headers []kafka.Header) context.Context {
	return Propagator.Extract(ctx, &KafkaCarrier{Headers: &headers})
}

// InjectKafka returns headers with traceparent (and tracestate) set to ctx's span context,
// replacing any it had, so that a record carries one trace context. Without a span context
// in ctx, headers are returned unchanged.
func InjectKafka(ctx context.Context, headers []kafka.Header) []kafka.Header {
	Propagator.Inject(ctx, &KafkaCarrier{Headers: &headers})
	return headers
}

// ExtractMap returns ctx with the remote span context of m's traceparent key (outbox
// headers, Pub/Sub and SQS attributes).
func ExtractMap(ctx context.Context, m map[string]string) context.Context {
	return Propagator.Extract(ctx, propagation.MapCarrier(m))
}

// InjectMap sets m's traceparent (and tracestate) to ctx's span context, if any. m must not
// be nil.
func InjectMap(ctx context.Context, m map[string]string) {
	Propagator.Inject(ctx, propagation.MapCarrier(m))
}

// KafkaCarrier adapts a record's headers to OpenTelemetry's propagation. Header keys are
// matched regardless of case on read (producers differ) and written lowercase, as W3C
// Trace Context names them; Set replaces every header of the key.
type KafkaCarrier struct {
	Headers *[]kafka.Header
}

// Get returns the value of the first header named key.
func (c *KafkaCarrier) Get(key string) string {
	for _, h := range *c.Headers {
		if strings.EqualFold(h.Key, key) {
			return string(h.Value)
		}
	}
	return ""
}

// Set replaces the headers named key with one of value.
func (c *KafkaCarrier) Set(key, value string) {
	out := (*c.Headers)[:0:0]
	for _, h := range *c.Headers {
		if !strings.EqualFold(h.Key, key) {
			out = append(out, h)
		}
	}
	*c.Headers = append(out, kafka.Header{Key: strings.ToLower(key), Value: []byte(value)})
}

// Keys lists the header keys.
func (c *KafkaCarrier) Keys() []string {
	keys := make([]string, len(*c.Headers))
	for i, h := range *c.Headers {
		keys[i] = h.Key
	}
	return keys
}

// FromKafka returns the span context of a record's traceparent header; the zero one when
// it has none. A record without traceparent costs nothing.
func FromKafka(headers []kafka.Header) trace.SpanContext {
	for _, h := range headers {
		if strings.EqualFold(h.Key, "traceparent") {
			return trace.SpanContextFromContext(ExtractKafka(context.Background(), headers))
		}
	}
	return trace.SpanContext{}
}

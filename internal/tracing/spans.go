package tracing

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"reflect"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// The helpers of this file let idemd's components trace at (near) no cost while tracing is
// off: Tracer.Get tells them so, and they skip every span; the trace context a message
// brought is still passed on (FromHTTP, FromMap, WithContext), which allocates only when
// there is one.

// unsetGlobal is OpenTelemetry's global provider before anything was installed: a
// delegating provider whose spans record nothing until otel.SetTracerProvider is called
// (after which otel.GetTracerProvider returns the installed one instead).
var unsetGlobal = func() trace.TracerProvider {
	p := otel.GetTracerProvider()
	if reflect.TypeOf(p).String() != "*global.tracerProvider" {
		return nil // something installed a provider before this package's init
	}
	return p
}()

// Tracer starts the spans of one component. Build it with NewTracer and share it.
type Tracer struct {
	provider trace.TracerProvider // nil: OpenTelemetry's global one, read at each Get
	scope    string
	fixed    trace.Tracer // provider's tracer, when provider is set and records
	cached   atomic.Pointer[scopedTracer]
}

type scopedTracer struct {
	provider trace.TracerProvider
	tracer   trace.Tracer
}

// NewTracer returns the Tracer of the component named scope (its import path) on provider;
// a nil provider means OpenTelemetry's global one (what Setup installs), looked up at each
// span so that a provider installed later is used.
func NewTracer(provider trace.TracerProvider, scope string) *Tracer {
	t := &Tracer{provider: provider, scope: scope}
	if provider != nil && !off(provider) {
		t.fixed = provider.Tracer(scope)
	}
	return t
}

// Get returns the tracer to start spans with, or false when tracing is off: the provider
// is a no-op one (Setup found no OTEL_* configuration) or none was installed. Callers skip
// their span work then. A nil Tracer is off.
func (t *Tracer) Get() (trace.Tracer, bool) {
	switch {
	case t == nil:
		return nil, false
	case t.provider != nil:
		return t.fixed, t.fixed != nil
	}
	p := otel.GetTracerProvider()
	if off(p) {
		return nil, false
	}
	if c := t.cached.Load(); c != nil && same(c.provider, p) {
		return c.tracer, true
	}
	tr := p.Tracer(t.scope)
	t.cached.Store(&scopedTracer{provider: p, tracer: tr})
	return tr, true
}

// off: p records nothing.
func off(p trace.TracerProvider) bool {
	switch p.(type) {
	case noop.TracerProvider, *noop.TracerProvider:
		return true
	}
	return unsetGlobal != nil && same(p, unsetGlobal)
}

// same compares providers without panicking on a type that is not comparable.
func same(a, b trace.TracerProvider) bool {
	ta := reflect.TypeOf(a)
	return ta == reflect.TypeOf(b) && ta.Comparable() && a == b
}

// FromHTTP returns the span context of h's traceparent (and tracestate); the zero one when
// it has none, or a malformed one. A request without traceparent costs nothing.
func FromHTTP(h http.Header) trace.SpanContext {
	if len(h["Traceparent"]) == 0 {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(ExtractHTTP(context.Background(), h))
}

// FromMap returns the span context of m's traceparent key: a record's headers, an outbox
// row's stored headers, Pub/Sub or SQS attributes. The zero one when there is none.
func FromMap(m map[string]string) trace.SpanContext {
	if m["traceparent"] == "" {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(ExtractMap(context.Background(), m))
}

// WithContext returns m with traceparent (and tracestate) set to sc: a copy, so that the
// caller's map is not changed. Without a valid sc, m is returned as it is.
func WithContext(m map[string]string, sc trace.SpanContext) map[string]string {
	if !sc.IsValid() {
		return m
	}
	out := make(map[string]string, len(m)+2)
	maps.Copy(out, m)
	delete(out, "tracestate") // sc's own, or none
	Propagator.Inject(trace.ContextWithSpanContext(context.Background(), sc), propagation.MapCarrier(out))
	return out
}

// SetHTTP sets h's traceparent (and tracestate) to sc, when sc is valid.
func SetHTTP(h http.Header, sc trace.SpanContext) {
	if sc.IsValid() {
		InjectHTTP(trace.ContextWithSpanContext(context.Background(), sc), h)
	}
}

// Parent returns ctx with sc as the parent of the spans started from it, when sc is valid.
func Parent(ctx context.Context, sc trace.SpanContext) context.Context {
	if !sc.IsValid() {
		return ctx
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc)
}

// Links returns a link to each valid span context of scs, at most max (a batch's spans
// link to the messages they carry; a span keeps 128 links by default).
func Links(scs []trace.SpanContext) []trace.Link {
	var links []trace.Link
	for _, sc := range scs {
		if sc.IsValid() && len(links) < maxLinks {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	return links
}

// maxLinks is the SDK's default bound of links per span (OTEL_SPAN_LINK_COUNT_LIMIT).
const maxLinks = 128

// End ends span, marking it failed when err is not nil (Fail). span may be nil.
func End(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil {
		Fail(span, err)
	}
	span.End()
}

// Fail marks span failed with the error's type (error.type: a SQLSTATE, "timeout",
// "canceled", or the Go type of the innermost error). The error's message is never
// recorded: it may quote a payload (a PostgreSQL error quotes the value it refused) or a
// URL with its secret.
func Fail(span trace.Span, err error) {
	if span == nil || err == nil || !span.IsRecording() {
		return
	}
	typ := ErrorType(err)
	span.SetAttributes(semconv.ErrorTypeKey.String(typ))
	span.SetStatus(codes.Error, typ)
}

// ErrorType is the error.type of err: its SQLSTATE when PostgreSQL refused something,
// "timeout" or "canceled" for a context's end, else the Go type of the innermost error.
func ErrorType(err error) string {
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr):
		return pgErr.Code
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return fmt.Sprintf("%T", err)
		}
		err = next
	}
}

// Attributes of idemd's own, beside the semantic conventions'. None holds a payload, a
// secret or a tenant.
const (
	// AttrPipeline is the pipeline (source or subscription) a span works for.
	AttrPipeline = attribute.Key("idemd.pipeline")
	// AttrMessageID is the message id (or idempotency key) the message is deduplicated on.
	AttrMessageID = attribute.Key("idemd.message.id")
	// AttrOutcome is what the unit of work did with a message: applied, duplicate,
	// conflict, in_flight, dead_lettered or stale.
	AttrOutcome = attribute.Key("idemd.outcome")
	// AttrBatchSize is how many messages a transaction carries.
	AttrBatchSize = attribute.Key("idemd.batch.size")
	// AttrAttempt counts the runs of a message's effect in one transaction.
	AttrAttempt = attribute.Key("idemd.attempt")
	// AttrOperationID is the operation id of an outbox event (its operation-id header, the
	// Idempotency-Key of its HTTP delivery).
	AttrOperationID = attribute.Key("idemd.operation.id")
	// AttrEndpoint names the HTTP endpoint of a delivery.
	AttrEndpoint = attribute.Key("idemd.endpoint")
)

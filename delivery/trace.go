package delivery

import (
	"context"
	"net/url"
	"strconv"

	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemd/idemd/internal/tracing"
)

// The deliverer's span (OpenTelemetry): one "POST" client span per attempt, a child of
// the trace context stored with the event (its traceparent, written by the unit of work's
// enqueue span), with the HTTP semantic conventions' attributes. The URL is recorded as
// logged, scheme://host[:port] (a path or query may be a capability); bodies and headers
// are never recorded. Each request carries the attempt span's traceparent, or with tracing
// off the stored one, so that the endpoint continues the trace.

const tracerScope = "github.com/idemd/idemd/delivery"

// startAttempt starts the span of an attempt of r; nil when tracing is off.
func (d *Deliverer) startAttempt(ctx context.Context, ep *endpoint, r *row) (context.Context, trace.Span) {
	tr, ok := d.tracer.Get()
	if !ok {
		return ctx, nil
	}
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(
			semconv.HTTPRequestMethodPost, semconv.URLFull(ep.redacted),
			tracing.AttrEndpoint.String(ep.Name), tracing.AttrPipeline.String(r.pipeline),
			tracing.AttrOperationID.String(r.op.String()),
		),
	}
	if u, err := url.Parse(ep.redacted); err == nil {
		port, _ := strconv.Atoi(u.Port())
		if port == 0 {
			port = map[string]int{"http": 80, "https": 443}[u.Scheme]
		}
		opts = append(opts, trace.WithAttributes(semconv.ServerAddress(u.Hostname()), semconv.ServerPort(port)))
	}
	if r.attempts > 1 {
		opts = append(opts, trace.WithAttributes(semconv.HTTPRequestResendCount(r.attempts-1)))
	}
	return tr.Start(tracing.Parent(ctx, tracing.FromMap(r.headers)), "POST", opts...)
}

// endAttempt ends an attempt's span with its answer's status, or the error of a request
// that got none: 4xx and 5xx answers and errors mark it failed.
func endAttempt(span trace.Span, status int, err error) {
	if span == nil {
		return
	}
	if status != 0 {
		span.SetAttributes(semconv.HTTPResponseStatusCode(status))
	}
	switch {
	case err != nil:
		tracing.Fail(span, err)
	case status >= 400:
		span.SetAttributes(semconv.ErrorTypeKey.String(strconv.Itoa(status)))
		span.SetStatus(codes.Error, "")
	}
	span.End()
}

// traceRequest is the trace context an attempt's request carries: the attempt's span, or
// the one stored with the event.
func traceRequest(ctx context.Context, r *row) trace.SpanContext {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		return sc
	}
	return tracing.FromMap(r.headers)
}

package receiver

import (
	"net/http"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemd/idemd/exactlyonce"
	"github.com/idemd/idemd/internal/tracing"
)

// The receiver's span (OpenTelemetry): one server span per request, a child of the
// request's traceparent when it has one, with the HTTP semantic conventions' attributes
// (method, route, path, status) and idemd's (pipeline, message id, outcome). Headers,
// bodies, tenants and signatures are never recorded. The request's message carries the
// span's context into the unit of work (exactlyonce.Message.Trace); with tracing off it
// carries the request's traceparent, so that a traced sender's trace goes on downstream.

const tracerScope = "github.com/idemd/idemd/receiver"

// startRequest starts req's server span and returns req with it in its context; nil when
// tracing is off.
func (r *Receiver) startRequest(req *http.Request) (*http.Request, trace.Span) {
	tr, ok := r.tracer.Get()
	if !ok {
		return req, nil
	}
	scheme := "http"
	if req.TLS != nil {
		scheme = "https"
	}
	ctx, span := tr.Start(tracing.ExtractHTTP(req.Context(), req.Header), req.Method,
		trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(
			httpMethod(req.Method), semconv.URLPath(req.URL.Path), semconv.URLScheme(scheme),
			semconv.NetworkProtocolName("http"),
		))
	return req.WithContext(ctx), span
}

// endRequest names span after the route that served it and ends it with the answer's
// status; 5xx answers mark it failed.
func endRequest(span trace.Span, req *http.Request, src *source, status int) {
	if span == nil {
		return
	}
	if src != nil {
		route := src.path
		if req.URL.Path != src.path {
			route += "/{key}" // an API source's item: PUT, GET, PATCH, DELETE {path}/{key}
		}
		span.SetName(req.Method + " " + route)
		span.SetAttributes(semconv.HTTPRoute(route), tracing.AttrPipeline.String(src.name))
	}
	span.SetAttributes(semconv.HTTPResponseStatusCode(status))
	if status >= 500 {
		span.SetAttributes(semconv.ErrorTypeKey.String(strconv.Itoa(status)))
		span.SetStatus(codes.Error, "") // the status code says why
	}
	span.End()
}

// httpMethod is the http.request.method attribute: a known method, or _OTHER.
func httpMethod(m string) attribute.KeyValue {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return semconv.HTTPRequestMethodKey.String(m)
	}
	return semconv.HTTPRequestMethodOther
}

// requestTrace is the trace context of a request's message: its server span, or with
// tracing off the traceparent it came with.
func requestTrace(req *http.Request) trace.SpanContext {
	if sc := trace.SpanContextFromContext(req.Context()); sc.IsValid() {
		return sc
	}
	return tracing.FromHTTP(req.Header)
}

// noteMessage records the message's id and outcome on the request's span.
func noteMessage(span trace.Span, m *exactlyonce.Message) {
	if span.IsRecording() {
		span.SetAttributes(tracing.AttrMessageID.String(m.ID), tracing.AttrOutcome.String(m.Outcome.String()))
	}
}

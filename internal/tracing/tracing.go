// Package tracing configures OpenTelemetry tracing for idemd from OpenTelemetry's standard
// OTEL_* variables, and carries W3C trace context (traceparent, tracestate) across the hops
// idemd handles: HTTP headers, Kafka record headers, and string maps (the outbox's stored
// headers, Pub/Sub and SQS attributes).
//
// Guarantee: tracing is off unless OTEL_EXPORTER_OTLP_ENDPOINT (or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) or OTEL_TRACES_EXPORTER is set; then no span is
// recorded or exported. The W3C propagator is installed either way, so a trace context that
// arrives with a message is passed on unchanged to what idemd sends downstream, and a traced
// caller's trace continues past idemd even when idemd itself does not record.
package tracing

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// ServiceNameDefault is the service.name of idemd's spans unless OTEL_SERVICE_NAME says
// otherwise.
const ServiceNameDefault = "idemd"

// errorLogInterval bounds how often export errors are logged: a collector that is down
// would otherwise log once per batch.
const errorLogInterval = time.Minute

// Config configures Setup.
type Config struct {
	// Getenv reads the OTEL_* variables (cmd passes its environment: only cmd reads it).
	// Required.
	Getenv func(name string) (string, bool)
	// ServiceVersion is the service.version of the spans. Defaults to none.
	ServiceVersion string
	// Logger receives export errors, at most once a minute. Defaults to logrus's standard
	// logger.
	Logger *logrus.Entry
	// Console is where OTEL_TRACES_EXPORTER=console writes the spans. Defaults to stderr
	// (stdout is for command output).
	Console io.Writer
}

// Tracing is the tracing Setup configured. Shutdown flushes it.
type Tracing struct {
	provider *sdktrace.TracerProvider // nil when tracing is off
}

// Enabled reports whether spans are recorded and exported.
func (t *Tracing) Enabled() bool { return t.provider != nil }

// TracerProvider is the provider Setup installed globally (a no-op one when tracing is
// off); components that take a provider in their config default to it.
func (t *Tracing) TracerProvider() trace.TracerProvider {
	if t.provider == nil {
		return noop.NewTracerProvider()
	}
	return t.provider
}

// Shutdown exports the spans still buffered and stops the exporter, within ctx. It is safe
// to call when tracing is off, and twice.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t.provider == nil {
		return nil
	}
	return t.provider.Shutdown(ctx)
}

// Setup reads the OTEL_* variables and installs the global tracer provider and the W3C
// propagator (otel.SetTracerProvider, otel.SetTextMapPropagator). It reports every bad
// variable at once, naming it.
//
// Read here: OTEL_SDK_DISABLED, OTEL_TRACES_EXPORTER (otlp, console, none),
// OTEL_EXPORTER_OTLP_PROTOCOL and OTEL_EXPORTER_OTLP_TRACES_PROTOCOL (http/protobuf, the
// default, or grpc), OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER and
// OTEL_TRACES_SAMPLER_ARG. The OTLP exporter reads its own connection settings (endpoint,
// headers, certificates, timeout, compression) from the process environment, as
// OpenTelemetry specifies them.
func Setup(ctx context.Context, cfg *Config) (*Tracing, error) {
	otel.SetTextMapPropagator(Propagator)
	get := func(name string) string {
		v, _ := cfg.Getenv(name)
		return strings.TrimSpace(v)
	}
	if !enabled(get) {
		otel.SetTracerProvider(noop.NewTracerProvider())
		return &Tracing{}, nil
	}
	if err := check(get); err != nil {
		return nil, err
	}
	sampler, _ := samplerFrom(get)
	res, _ := resourceFrom(get, cfg.ServiceVersion)
	exporter, err := exporterFrom(ctx, get, cmp.Or[io.Writer](cfg.Console, os.Stderr))
	if err != nil {
		return nil, fmt.Errorf("error creating the trace exporter: %w", err)
	}
	log := cfg.Logger
	if log == nil {
		log = logrus.NewEntry(logrus.StandardLogger())
	}
	otel.SetErrorHandler(&errorLogger{log: log.WithField("component", "tracing")})
	provider := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exporter),
		sdktrace.WithSampler(sampler),
		sdktrace.WithResource(res),
	)
	otel.SetTracerProvider(provider)
	return &Tracing{provider: provider}, nil
}

// Check reports every OTEL_* variable that Setup would refuse, by name, without installing
// anything (idemd check, and every command that runs the daemon, before it starts).
// Nothing is checked while tracing is off.
func Check(getenv func(name string) (string, bool)) error {
	return check(func(name string) string {
		v, _ := getenv(name)
		return strings.TrimSpace(v)
	})
}

func check(get func(string) string) error {
	if !enabled(get) {
		return nil
	}
	_, errSampler := samplerFrom(get)
	_, errResource := resourceFrom(get, "")
	return errors.Join(checkExporter(get), errSampler, errResource)
}

// enabled: on when an exporter or an OTLP endpoint is named, unless the SDK is disabled or
// the exporter is "none".
func enabled(get func(string) string) bool {
	if strings.EqualFold(get("OTEL_SDK_DISABLED"), "true") {
		return false
	}
	if exp := get("OTEL_TRACES_EXPORTER"); exp != "" {
		return exp != "none"
	}
	return get("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// exporterFrom builds the exporter of a configuration check accepted.
func exporterFrom(ctx context.Context, get func(string) string, console io.Writer) (sdktrace.SpanExporter, error) {
	switch {
	case exporterName(get) == "console":
		return stdouttrace.New(stdouttrace.WithWriter(console))
	case protocolName(get) == "grpc":
		return otlptracegrpc.New(ctx)
	default:
		return otlptracehttp.New(ctx)
	}
}

func exporterName(get func(string) string) string { return cmp.Or(get("OTEL_TRACES_EXPORTER"), "otlp") }

func protocolName(get func(string) string) string {
	return cmp.Or(get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), get("OTEL_EXPORTER_OTLP_PROTOCOL"), "http/protobuf")
}

// checkExporter refuses an exporter or OTLP protocol idemd does not have.
func checkExporter(get func(string) string) error {
	switch exp := exporterName(get); exp {
	case "console":
		return nil
	case "otlp":
		switch p := protocolName(get); p {
		case "http/protobuf", "grpc":
			return nil
		default:
			name := "OTEL_EXPORTER_OTLP_PROTOCOL"
			if get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") != "" {
				name = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
			}
			return fmt.Errorf("%s: %q is not supported (http/protobuf or grpc)", name, p)
		}
	default:
		return fmt.Errorf("OTEL_TRACES_EXPORTER: %q is not supported (otlp, console or none)", exp)
	}
}

// samplerFrom builds the sampler of OTEL_TRACES_SAMPLER; the default follows the caller's
// decision and samples the traces idemd starts (parentbased_always_on).
func samplerFrom(get func(string) string) (sdktrace.Sampler, error) {
	ratio := func() (float64, error) {
		arg := get("OTEL_TRACES_SAMPLER_ARG")
		if arg == "" {
			return 1, nil
		}
		r, err := strconv.ParseFloat(arg, 64)
		if err != nil || r < 0 || r > 1 {
			return 0, fmt.Errorf("OTEL_TRACES_SAMPLER_ARG: %q is not a ratio between 0 and 1", arg)
		}
		return r, nil
	}
	switch s := cmp.Or(get("OTEL_TRACES_SAMPLER"), "parentbased_always_on"); s {
	case "always_on":
		return sdktrace.AlwaysSample(), nil
	case "always_off":
		return sdktrace.NeverSample(), nil
	case "traceidratio":
		r, err := ratio()
		return sdktrace.TraceIDRatioBased(r), err
	case "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case "parentbased_traceidratio":
		r, err := ratio()
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(r)), err
	default:
		return nil, fmt.Errorf("OTEL_TRACES_SAMPLER: %q is not a sampler (always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off, parentbased_traceidratio)", s)
	}
}

// resourceFrom describes the service: OTEL_RESOURCE_ATTRIBUTES (key=value pairs, values
// percent-encoded), then service.name from OTEL_SERVICE_NAME (default idemd) and
// service.version.
func resourceFrom(get func(string) string, version string) (*resource.Resource, error) {
	var attrs []attribute.KeyValue
	var errs []error
	if raw := get("OTEL_RESOURCE_ATTRIBUTES"); raw != "" {
		for _, pair := range strings.Split(raw, ",") {
			k, v, ok := strings.Cut(pair, "=")
			k = strings.TrimSpace(k)
			value, err := url.PathUnescape(strings.TrimSpace(v))
			if !ok || k == "" || err != nil {
				errs = append(errs, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %q is not key=value (value percent-encoded)", pair))
				continue
			}
			attrs = append(attrs, attribute.String(k, value))
		}
	}
	attrs = append(attrs, semconv.ServiceName(cmp.Or(get("OTEL_SERVICE_NAME"), ServiceNameDefault)))
	if version != "" {
		attrs = append(attrs, semconv.ServiceVersion(version))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return resource.NewWithAttributes(semconv.SchemaURL, attrs...), nil
}

// errorLogger logs OpenTelemetry's errors (failed exports, mostly) at warning level, at
// most once per errorLogInterval, counting the ones it kept quiet.
type errorLogger struct {
	log     *logrus.Entry
	mu      sync.Mutex
	last    time.Time
	dropped int
}

func (h *errorLogger) Handle(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if time.Since(h.last) < errorLogInterval {
		h.dropped++
		return
	}
	h.log.WithError(err).WithField("count", h.dropped+1).Warn("error exporting traces; spans are dropped until the collector answers")
	h.last, h.dropped = time.Now(), 0
}

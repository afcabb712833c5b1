package tracing

// Variable is one of the OTEL_* variables Setup reads, as --help and the README show it.
type Variable struct {
	Name, Default, Help string
}

// Variables are the OTEL_* variables Setup reads, in the order --help lists them. Tracing
// is off unless one of the first three is set.
var Variables = []Variable{
	{"OTEL_EXPORTER_OTLP_ENDPOINT", "", "base URL of the OpenTelemetry collector (http/protobuf: http://host:4318, grpc: http://host:4317); setting it turns tracing on"},
	{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "", "the same for traces only, as a full URL (http://host:4318/v1/traces)"},
	{"OTEL_TRACES_EXPORTER", "", "otlp, console (spans as JSON on stderr) or none; setting it turns tracing on (none: off); otlp when only an endpoint is set"},
	{"OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf", "http/protobuf or grpc (OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: for traces only)"},
	{"OTEL_SERVICE_NAME", ServiceNameDefault, "service.name of idemd's spans"},
	{"OTEL_RESOURCE_ATTRIBUTES", "", "more resource attributes, key=value,… (values percent-encoded)"},
	{"OTEL_TRACES_SAMPLER", "parentbased_always_on", "always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio"},
	{"OTEL_TRACES_SAMPLER_ARG", "1", "the ratio of the traceidratio samplers, from 0 to 1"},
	{"OTEL_SDK_DISABLED", "false", "true turns tracing off, whatever else is set"},
}

// VariablesNote says which other OTEL_* variables apply: the OTLP exporter and the SDK read
// them from the process environment themselves.
const VariablesNote = "The OTLP exporter also reads OTEL_EXPORTER_OTLP_HEADERS (never logged), _CERTIFICATE, _INSECURE, _TIMEOUT and _COMPRESSION (and their _TRACES_ forms); the span batcher OTEL_BSP_*."

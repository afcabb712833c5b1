package delivery

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemd/idemd/internal/metrics"
)

var (
	// attemptsTotal counts delivery attempts per endpoint and outcome.
	attemptsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idemd_http_delivery_attempts_total",
		Help: "Outbound HTTP delivery attempts, by endpoint and outcome (delivered, retry, dead_lettered, disabled).",
	}, []string{"endpoint", "outcome"})
	// attemptDuration is the latency of delivery requests.
	attemptDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "idemd_http_delivery_duration_seconds",
		Help:    "Duration of outbound HTTP delivery requests.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	}, []string{"endpoint"})
	// endpointDisabled is 1 while an endpoint is disabled (it answered 410 Gone).
	endpointDisabled = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "idemd_http_endpoint_disabled",
		Help: "1 while an outbound HTTP endpoint is disabled (it answered 410 Gone); its events stay queued.",
	}, []string{"endpoint"})
	// backlog is the number of pending deliveries per endpoint.
	backlog = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "idemd_http_delivery_backlog",
		Help: "Pending outbound HTTP deliveries per endpoint.",
	}, []string{"endpoint"})
	// breakerOpen is 1 while an endpoint's circuit breaker is open or half-open.
	breakerOpen = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "idemd_http_endpoint_breaker_open",
		Help: "1 while an outbound HTTP endpoint's circuit breaker is open (or half-open, probing); its events wait.",
	}, []string{"endpoint"})
	// breakerTransitions counts the breaker's state changes.
	breakerTransitions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idemd_http_endpoint_breaker_transitions_total",
		Help: "Circuit breaker state changes of outbound HTTP endpoints, by the state entered (open, half_open, closed).",
	}, []string{"endpoint", "state"})
	// oldestPending is the age of the oldest pending delivery per endpoint.
	oldestPending = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "idemd_http_delivery_oldest_pending_age_seconds",
		Help: "Age of the oldest pending outbound HTTP delivery per endpoint (0 when none).",
	}, []string{"endpoint"})
)

func init() {
	metrics.Registry.MustRegister(attemptsTotal, attemptDuration, endpointDisabled, backlog, oldestPending, breakerOpen, breakerTransitions)
}

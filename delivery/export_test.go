package delivery

// EndpointDisabledGauge exposes the gauge to the external tests.
var EndpointDisabledGauge = endpointDisabled

// BacklogGauge and OldestPendingGauge expose the backlog gauges to the external tests.
var BacklogGauge, OldestPendingGauge = backlog, oldestPending

package delivery

// EndpointDisabledGauge exposes the gauge to the external tests.
var EndpointDisabledGauge = endpointDisabled

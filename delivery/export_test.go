package delivery

// EndpointDisabledGauge exposes the gauge to the external tests.
var EndpointDisabledGauge = endpointDisabled

// BacklogGauge and OldestPendingGauge expose the backlog gauges to the external tests.
var BacklogGauge, OldestPendingGauge = backlog, oldestPending

// DelivererSignals are the deliverer's test signals, for the external tests.
type DelivererSignals = delivererSignals

// EndpointSignal is the value of the EndpointState signal.
type EndpointSignal = endpointState

// TestSignals returns d's test signals; initialise the ones a test waits on before Run.
func (d *Deliverer) TestSignals() *DelivererSignals { return &d.signals }

// BreakerTransitions and BreakerOpenGauge expose the breaker's metrics to the external tests.
var BreakerTransitions, BreakerOpenGauge = breakerTransitions, breakerOpen

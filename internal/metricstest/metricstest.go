// Package metricstest reads idemd's series (internal/metrics.Registry) in tests without
// creating them, as a WithLabelValues would: a test can tell a series at 0 from one that
// does not exist.
package metricstest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/metrics"
)

// Sum returns the sum of the counters and gauges of series name whose labels include
// labels, and how many series matched.
func Sum(tb testing.TB, name string, labels map[string]string) (float64, int) {
	tb.Helper()
	families, err := metrics.Registry.Gather()
	require.NoError(tb, err)
	sum, n := 0.0, 0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue series
				}
			}
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			n++
		}
	}
	return sum, n
}

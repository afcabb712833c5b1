package metricstest_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/metrics"
	"github.com/idemd/idemd/internal/metricstest"
)

func TestSum(t *testing.T) {
	t.Parallel()
	p := t.Name()
	v, n := metricstest.Sum(t, "idemd_dead_letters_replayed_total", map[string]string{"pipeline": p})
	require.Zero(t, v)
	require.Zero(t, n, "reading creates nothing")
	metrics.DeadLettersReplayed.WithLabelValues(p, "http", "applied").Add(2)
	metrics.DeadLettersReplayed.WithLabelValues(p, "http", "stale")
	metrics.DeadLettersReplayed.WithLabelValues(p+"-other", "http", "applied").Inc()
	v, n = metricstest.Sum(t, "idemd_dead_letters_replayed_total", map[string]string{"pipeline": p})
	require.Equal(t, 2.0, v)
	require.Equal(t, 2, n)
	v, n = metricstest.Sum(t, "idemd_dead_letters_replayed_total", map[string]string{"pipeline": p, "outcome": "stale"})
	require.Zero(t, v)
	require.Equal(t, 1, n, "a series at 0 exists")
}

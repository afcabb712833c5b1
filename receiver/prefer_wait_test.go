package receiver

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPreferWaitClamped: "Prefer: wait=N" never yields a negative or overflowing wait:
// N × 1 s overflowed a Duration from N = 9223372037 on and became negative.
func TestPreferWaitClamped(t *testing.T) {
	t.Parallel()
	max := 30 * time.Second
	for v, want := range map[string]time.Duration{
		"wait=5":                     5 * time.Second,
		`wait="7"`:                   7 * time.Second,
		"respond-async, wait=30":     30 * time.Second,
		"wait=31":                    max,
		"wait=9223372037":            max,
		"wait=18446744074":           max,
		"wait=9223372036854775807":   max,
		"wait=99999999999999999999":  max,
		"wait=0":                     0,
		"wait=-5":                    0,
		"wait=-99999999999999999999": 0,
		"wait=soon":                  0,
		"return=minimal":             0,
	} {
		got := preferWait([]string{v}, max)
		require.Equal(t, want, got, v)
		require.GreaterOrEqual(t, got, time.Duration(0), v)
	}
}

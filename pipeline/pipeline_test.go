package pipeline_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/pipeline"
)

func TestParseDuration(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]time.Duration{
		"30d": 30 * 24 * time.Hour, "24h": 24 * time.Hour, "1d12h": 36 * time.Hour, "5m": 5 * time.Minute, "0d": 0,
	} {
		got, err := pipeline.ParseDuration(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "d", "30", "1.5d", "-1d", "30days", "1dd", "h"} {
		_, err := pipeline.ParseDuration(in)
		require.Error(t, err, in)
	}
}

func TestFieldValidate(t *testing.T) {
	t.Parallel()
	require.NoError(t, (&pipeline.Field{JSON: "/id"}).Validate(false))
	require.NoError(t, (&pipeline.Field{Key: true}).Validate(true))
	require.ErrorContains(t, (&pipeline.Field{Key: true}).Validate(false), "only subscriptions")
	require.ErrorContains(t, (&pipeline.Field{JSON: "id"}).Validate(false), "json")
	require.ErrorContains(t, (&pipeline.Field{JSON: "/id", Header: "X"}).Validate(false), "exactly one")
	require.ErrorContains(t, (&pipeline.Field{}).Validate(true), "missing: set one of json, header and key")
}

// TestParseDurationOverflow: a day count plus a Go duration can exceed int64 nanoseconds;
// ParseDuration must then fail, not return a negative duration without an error.
func TestParseDurationOverflow(t *testing.T) {
	d, err := pipeline.ParseDuration("100000d2562047h")
	if err == nil {
		t.Fatalf("ParseDuration accepted an overflowing duration: %s", d)
	}
}

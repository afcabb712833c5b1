package retry_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/retry"
)

func TestBackoffIsCappedFullJitter(t *testing.T) {
	t.Parallel()
	for failures := range 40 {
		d := retry.Backoff(100*time.Millisecond, 5*time.Second, failures)
		require.GreaterOrEqual(t, d, time.Duration(0))
		require.LessOrEqual(t, d, 5*time.Second)
	}
	for range 100 {
		require.LessOrEqual(t, retry.Backoff(100*time.Millisecond, 5*time.Second, 1), 100*time.Millisecond)
		require.LessOrEqual(t, retry.Backoff(100*time.Millisecond, 5*time.Second, 3), 400*time.Millisecond)
	}
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	cases := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"", 0, false},
		{"3", 3 * time.Second, true},
		{" 0 ", 0, true},
		{"-1", 0, false},
		{"soon", 0, false},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true},
		{"99999999999999", 100 * 365 * 24 * time.Hour, true},
	}
	for _, c := range cases {
		d, ok := retry.RetryAfter(c.in, now)
		require.Equal(t, c.ok, ok, c.in)
		require.Equal(t, c.want, d, c.in)
	}
}

func TestRetryable(t *testing.T) {
	t.Parallel()
	for _, s := range []int{408, 425, 429, 500, 502, 503, 504, 599} {
		require.True(t, retry.Retryable(s), s)
	}
	for _, s := range []int{200, 301, 400, 401, 403, 404, 409, 410, 422} {
		require.False(t, retry.Retryable(s), s)
	}
}

// Package retry holds the retry arithmetic shared by idemd's retry loops (the unit of work's
// transient retries, the relay's broker outages, the delivery sink and the idemclient
// package): capped exponential backoff with full jitter, Retry-After parsing, and which HTTP
// statuses are worth another attempt.
package retry

import (
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Backoff is the wait before attempt number failures+1, after failures failed attempts:
// a uniformly random duration in [0, min(hi, lo·2^(failures-1))] ("full jitter"), so that
// many clients that failed together do not retry together.
func Backoff(lo, hi time.Duration, failures int) time.Duration {
	if failures < 1 {
		failures = 1
	}
	d := lo << min(failures-1, 30)
	if d <= 0 || d > hi {
		d = hi
	}
	if d <= 0 {
		return 0
	}
	return rand.N(d + 1)
}

// RetryAfter parses a Retry-After header value, delay-seconds or an HTTP date, into a
// wait from now. ok is false when the value is absent or malformed; a date in the past
// is a zero wait.
func RetryAfter(value string, now time.Time) (d time.Duration, ok bool) {
	value = strings.TrimSpace(value)
	if value == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(value, 10, 64); err == nil {
		if secs < 0 {
			return 0, false
		}
		// Bound it: a huge value must not overflow into a negative duration.
		return time.Duration(min(secs, int64(100*365*24*3600))) * time.Second, true
	}
	t, err := http.ParseTime(value)
	if err != nil {
		return 0, false
	}
	return max(t.Sub(now), 0), true
}

// Retryable reports whether an HTTP status means "the same request may succeed later":
// 408 Request Timeout, 425 Too Early, 429 Too Many Requests and every 5xx.
func Retryable(status int) bool {
	switch {
	case status == http.StatusRequestTimeout, status == http.StatusTooEarly, status == http.StatusTooManyRequests:
		return true
	case status >= 500 && status <= 599:
		return true
	}
	return false
}

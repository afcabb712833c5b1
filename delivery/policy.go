package delivery

import (
	"errors"
	"time"
)

// Defaults of Breaker.
const (
	BreakerFailuresDefault = 5
	BreakerCoolDownDefault = 30 * time.Second
)

// RetryPolicy is one endpoint's retry policy (Endpoint.Retry). Its zero fields take the
// deliverer's (Config.MaxAttempts, MaxAge, BackoffMin, BackoffMax).
type RetryPolicy struct {
	// MaxAttempts bounds the attempts per event before it is dead-lettered. Defaults to
	// Config.MaxAttempts (20).
	MaxAttempts int `yaml:"max_attempts"`
	// MaxAge bounds how long after it was enqueued an event is retried. Defaults to
	// Config.MaxAge (24 h).
	MaxAge time.Duration `yaml:"max_age"`
	// MinBackoff and MaxBackoff bound the wait between attempts (full jitter over
	// min(MaxBackoff, MinBackoff·2^(attempts-1)), never less than Retry-After). Default to
	// Config.BackoffMin and BackoffMax (5 s and 2 h).
	MinBackoff time.Duration `yaml:"min_backoff"`
	MaxBackoff time.Duration `yaml:"max_backoff"`
}

// withDefaults fills r's zero fields from c and checks the result.
func (r RetryPolicy) withDefaults(c *Config) (RetryPolicy, error) {
	if r.MaxAttempts == 0 {
		r.MaxAttempts = c.MaxAttempts
	}
	if r.MaxAge == 0 {
		r.MaxAge = c.MaxAge
	}
	if r.MinBackoff == 0 {
		r.MinBackoff = c.BackoffMin
	}
	if r.MaxBackoff == 0 {
		r.MaxBackoff = max(c.BackoffMax, r.MinBackoff)
	}
	switch {
	case r.MaxAttempts < 1:
		return r, errors.New("Retry.MaxAttempts must be positive")
	case r.MaxAge < 0, r.MinBackoff < 0:
		return r, errors.New("Retry.MaxAge and MinBackoff must not be negative")
	case r.MaxBackoff < r.MinBackoff:
		return r, errors.New("Retry.MaxBackoff is below MinBackoff")
	}
	return r, nil
}

// Breaker is an endpoint's circuit breaker (Endpoint.Breaker). After Failures consecutive
// failed attempts (no answer, a timeout, 408, 425, 429 or 5xx) it opens: nothing is sent
// to the endpoint for CoolDown, and its events wait, queued. Then one event is sent as a
// probe (half-open): if it fails the breaker opens again for CoolDown; any answer that is
// not a failure (2xx, or a refusal such as 400, which shows the endpoint is there) closes
// it, and the waiting events flow again. The breaker's state lives in PostgreSQL
// (http_endpoints), shared by every deliverer and kept across restarts.
type Breaker struct {
	// Failures is how many consecutive failed attempts open the breaker. Defaults to 5.
	Failures int `yaml:"failures"`
	// CoolDown is how long the breaker stays open before its probe. Defaults to 30 s.
	CoolDown time.Duration `yaml:"cool_down"`
}

func (b Breaker) withDefaults() (Breaker, error) {
	if b.Failures == 0 {
		b.Failures = BreakerFailuresDefault
	}
	if b.CoolDown == 0 {
		b.CoolDown = BreakerCoolDownDefault
	}
	if b.Failures < 1 || b.CoolDown < 0 {
		return b, errors.New("Breaker.Failures must be positive and CoolDown not negative")
	}
	return b, nil
}

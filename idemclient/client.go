// Package idemclient calls idempotent HTTP APIs the way the IETF Idempotency-Key draft
// expects: idemd's own API sources, or any API that honours an Idempotency-Key header.
// Guarantee: one logical operation is sent with one key, chosen once before the first
// attempt and repeated unchanged on every retry, so however many attempts reach the server
// it applies the operation at most once, and a retry after a lost answer returns the
// original result. Retries (network errors, 409, 408, 425, 429, 5xx) wait a capped
// exponential backoff with full jitter and never less than the server's Retry-After; other
// 4xx are never retried. For an operation that must survive a restart of the caller, store a key
// (NewKey) with the operation and set it on the request yourself.
package idemclient

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/google/uuid"

	"github.com/idemd/idemd/internal/retry"
)

// HeaderIdempotencyKey is the request header that carries the key.
const HeaderIdempotencyKey = "Idempotency-Key"

// Defaults of Config.
const (
	MaxAttemptsDefault   = 6
	BackoffMinDefault    = 200 * time.Millisecond
	BackoffMaxDefault    = 10 * time.Second
	RetryAfterMaxDefault = time.Minute
)

// Config configures a Client.
type Config struct {
	// HTTPClient sends the requests; set its Timeout to bound each attempt. Defaults to
	// http.DefaultClient.
	HTTPClient *http.Client
	// MaxAttempts bounds the attempts of one operation, the first included. Defaults to 6.
	MaxAttempts int
	// BackoffMin and BackoffMax bound the wait between attempts: full jitter over
	// min(BackoffMax, BackoffMin·2^(attempt-1)). Defaults to 200 ms and 10 s.
	BackoffMin, BackoffMax time.Duration
	// RetryAfterMax is the longest Retry-After the client waits for; a longer one ends the
	// retries and Do returns that answer. Defaults to 1 min.
	RetryAfterMax time.Duration
	// OnRetry, when set, is called before each wait between attempts (logs, metrics, tests).
	OnRetry func(Retry)
}

// Retry describes a failed attempt that will be retried.
type Retry struct {
	// Key is the idempotency key, the same on every attempt.
	Key string
	// Attempt is the number of the failed attempt, from 1.
	Attempt int
	// Status is the answer's status, 0 when there was none (Err says why).
	Status int
	Err    error
	// Wait is how long the client waits before the next attempt.
	Wait time.Duration
}

// Client sends requests with an idempotency key and retries them safely. It is safe for
// concurrent use.
type Client struct {
	http *http.Client
	cfg  Config
}

// New returns a Client; cfg may be nil.
func New(cfg *Config) (*Client, error) {
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	c.MaxAttempts = cmp.Or(c.MaxAttempts, MaxAttemptsDefault)
	c.BackoffMin = cmp.Or(c.BackoffMin, BackoffMinDefault)
	c.BackoffMax = cmp.Or(c.BackoffMax, BackoffMaxDefault)
	c.RetryAfterMax = cmp.Or(c.RetryAfterMax, RetryAfterMaxDefault)
	switch {
	case c.MaxAttempts < 1:
		return nil, fmt.Errorf("idemclient: Config.MaxAttempts must be positive, got %d", c.MaxAttempts)
	case c.BackoffMin < 0 || c.BackoffMax < c.BackoffMin:
		return nil, fmt.Errorf("idemclient: Config.BackoffMax (%s) is below BackoffMin (%s)", c.BackoffMax, c.BackoffMin)
	case c.RetryAfterMax < 0:
		return nil, fmt.Errorf("idemclient: Config.RetryAfterMax must be positive, got %s", c.RetryAfterMax)
	}
	return &Client{http: cmp.Or(c.HTTPClient, http.DefaultClient), cfg: c}, nil
}

// NewKey returns a fresh idempotency key (a random UUIDv4). Store it with the operation
// when the operation must survive a restart: after a crash, send it again with the same key.
func NewKey() string { return uuid.NewString() }

// ErrBodyNotReplayable: the request has a body but no GetBody, so it cannot be resent.
var ErrBodyNotReplayable = errors.New("idemclient: request body is not replayable: build it with http.NewRequest from a bytes.Reader, bytes.Buffer or strings.Reader, or set GetBody")

// Do sends req until the server gives a final answer, and returns it. The key is req's
// Idempotency-Key header when the caller set one, else a new UUIDv4; either way it is fixed
// before the first attempt and sent on every attempt (the response's Request carries it).
//
// The returned response is the first answer that is not retried: a 2xx, another 4xx, a
// Retry-After beyond RetryAfterMax; or, when MaxAttempts ran out, the last answer, whatever
// its status. Do returns an error only when no answer came (the last network error), when
// ctx ended (wrapping ctx.Err()), or when req's body cannot be replayed. req is not
// modified.
func (c *Client) Do(ctx context.Context, req *http.Request) (*http.Response, error) {
	if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
		return nil, ErrBodyNotReplayable
	}
	key := req.Header.Get(HeaderIdempotencyKey)
	if key == "" {
		key = NewKey()
	}
	for attempt := 1; ; attempt++ {
		resp, err := c.send(ctx, req, key)
		if ctx.Err() != nil {
			if resp != nil {
				resp.Body.Close()
			}
			return nil, fmt.Errorf("idemclient: %s %s with key %s: %w", req.Method, req.URL.Redacted(), key, ctx.Err())
		}
		r := Retry{Key: key, Attempt: attempt, Err: err}
		var retryAfter time.Duration
		switch {
		case err != nil:
			if !retryableError(err) || attempt >= c.cfg.MaxAttempts {
				return nil, fmt.Errorf("idemclient: %s %s with key %s, attempt %d of %d: %w", req.Method, req.URL.Redacted(), key, attempt, c.cfg.MaxAttempts, err)
			}
		default:
			r.Status = resp.StatusCode
			if !retryableStatus(resp.StatusCode) || attempt >= c.cfg.MaxAttempts {
				return resp, nil
			}
			var ok bool
			retryAfter, ok = retry.RetryAfter(resp.Header.Get("Retry-After"), time.Now())
			if ok && retryAfter > c.cfg.RetryAfterMax {
				return resp, nil
			}
			// Drain a little so that the connection can be reused, then let it go.
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
		}
		r.Wait = max(retry.Backoff(c.cfg.BackoffMin, c.cfg.BackoffMax, attempt), retryAfter)
		if c.cfg.OnRetry != nil {
			c.cfg.OnRetry(r)
		}
		timer := time.NewTimer(r.Wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil, fmt.Errorf("idemclient: %s %s with key %s, waiting after attempt %d: %w", req.Method, req.URL.Redacted(), key, attempt, ctx.Err())
		case <-timer.C:
		}
	}
}

// send makes one attempt on a copy of req with a fresh body.
func (c *Client) send(ctx context.Context, req *http.Request, key string) (*http.Response, error) {
	r := req.Clone(ctx)
	if req.GetBody != nil {
		body, err := req.GetBody()
		if err != nil {
			return nil, fmt.Errorf("error replaying the request body: %w", err)
		}
		r.Body = body
	}
	r.Header.Set(HeaderIdempotencyKey, key)
	return c.http.Do(r)
}

// retryableStatus: 409 (the same key is still in flight) and the statuses that mean "the
// same request may succeed later" (408, 425, 429, 5xx). Every other 4xx says the request
// itself is wrong and would fail again.
func retryableStatus(status int) bool {
	return status == http.StatusConflict || retry.Retryable(status)
}

// retryableError: a network error may have happened before or after the server applied
// the operation; the key makes the retry safe either way. A certificate the client refuses
// would be refused again.
func retryableError(err error) bool {
	var (
		unknownAuthority x509.UnknownAuthorityError
		hostname         x509.HostnameError
		invalid          x509.CertificateInvalidError
		verify           *tls.CertificateVerificationError
	)
	return !errors.As(err, &unknownAuthority) && !errors.As(err, &hostname) &&
		!errors.As(err, &invalid) && !errors.As(err, &verify)
}

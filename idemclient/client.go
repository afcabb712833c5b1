// Package idemclient calls idempotent HTTP APIs the way the IETF Idempotency-Key draft
// expects: idemd's own API sources, or any API that honours an Idempotency-Key header.
// Guarantee: one logical operation is sent with one key, chosen once before the first
// attempt and repeated unchanged on every retry, so however many attempts reach the server
// it applies the operation at most once, and a retry after a lost answer returns the
// original result. Retries (network errors, 409, 408, 425, 429, 5xx) wait a capped
// exponential backoff with full jitter and never less than the server's Retry-After; other
// 4xx are never retried. For an operation that must survive a restart of the caller, store a key
// (NewKey) with the operation and set it on the request yourself. Besides the client's
// retries, net/http may resend an attempt by itself on a failed keep-alive connection, with
// the same key (Config.MaxAttempts says when).
package idemclient

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/idemd/idemd/internal/idemkey"
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
	//
	// It counts the attempts of the client, not the requests the server may see: net/http's
	// Transport resends a request by itself, at once, in the cases it deems safe, and one
	// with an Idempotency-Key header is one of them (it counts as idempotent, like a GET):
	// over HTTP/1.1 when a reused keep-alive connection fails before an answer (the server
	// closed it meanwhile), and over HTTP/2 when the connection became unusable or the server
	// refused the stream or sent GOAWAY before processing it. That resend carries the same key, so it applies nothing twice,
	// but it is part of the attempt: no backoff, no OnRetry, not counted. With
	// http.Transport.DisableKeepAlives set, HTTP/1.1 attempts are never resent so.
	MaxAttempts int
	// BackoffMin and BackoffMax bound the wait between attempts: full jitter over
	// min(BackoffMax, BackoffMin·2^(attempt-1)). Defaults to 200 ms and 10 s.
	BackoffMin, BackoffMax time.Duration
	// RetryAfterMax is the longest Retry-After the client waits for; a longer one ends the
	// retries and Do returns that answer. Defaults to 1 min.
	RetryAfterMax time.Duration
	// OnRetry, when set, is called before each wait between attempts (logs, metrics, tests):
	// once per attempt that the client retries, not for the Transport's own resends
	// (MaxAttempts).
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

// ErrInvalidKey: the request's Idempotency-Key header does not hold one key of 1 to 255
// printable ASCII characters, the keys idemd (and the IETF draft) accept; the returned error
// says what is wrong. Do returns it before sending anything.
var ErrInvalidKey = errors.New("idemclient: invalid Idempotency-Key")

// Do sends req until the server gives a final answer, and returns it. The key is the one in
// req's Idempotency-Key header when the caller set one, else a new UUIDv4; either way it is
// fixed before the first attempt and sent on every attempt (the response's Request carries
// it). A key is 1 to 255 printable ASCII characters, as idemd requires; Do refuses another,
// or two header lines, with ErrInvalidKey before sending, where the server would answer 400.
// Set the key as it is ("order,42"); a value that is already a Structured Fields string
// ("\"order,42\"") is read as one. Do sends the key bare when it is an HTTP token (a UUID
// is), else as a Structured Fields string, which idemd reads back as the same key: sent
// bare, a key with a comma would be two keys.
//
// The operation ends when ctx or req's own context (http.NewRequestWithContext) ends,
// whichever comes first: its attempts and its waits.
//
// The returned response is the first answer that is not retried: a 2xx, another 4xx, a
// Retry-After beyond RetryAfterMax; or, when MaxAttempts ran out, the last answer, whatever
// its status. Do returns an error only when no answer came (the last network error, or one
// that no retry can mend: an unsupported URL scheme, no host, an invalid address or port, a
// certificate the client refuses), when a context ended (wrapping its Err()), when the key
// is invalid, or when req's body cannot be replayed. req is not modified.
func (c *Client) Do(ctx context.Context, req *http.Request) (*http.Response, error) {
	if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
		return nil, ErrBodyNotReplayable
	}
	key, err := requestKey(req)
	if err != nil {
		return nil, fmt.Errorf("%w on %s %s: %w", ErrInvalidKey, req.Method, req.URL.Redacted(), err)
	}
	// op ends with either context; ended says which one ended, ctx first.
	op, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(req.Context(), cancel)()
	ended := func() error { return cmp.Or(ctx.Err(), req.Context().Err()) }
	header := idemkey.Format(key)
	for attempt := 1; ; attempt++ {
		resp, err := c.send(op, req, header)
		if op.Err() != nil {
			if resp != nil {
				resp.Body.Close()
			}
			return nil, fmt.Errorf("idemclient: %s %s with key %s: %w", req.Method, req.URL.Redacted(), key, ended())
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
		case <-op.Done():
			timer.Stop()
			return nil, fmt.Errorf("idemclient: %s %s with key %s, waiting after attempt %d: %w", req.Method, req.URL.Redacted(), key, attempt, ended())
		case <-timer.C:
		}
	}
}

// requestKey is the key of req's Idempotency-Key header, or a new one when it has none. A
// value that starts with '"' is a Structured Fields string, read as idemd reads it; any
// other value is the key itself, which Do sends quoted when it must be.
func requestKey(req *http.Request) (string, error) {
	values := req.Header.Values(HeaderIdempotencyKey)
	switch {
	case len(values) == 0 || len(values) == 1 && values[0] == "":
		return NewKey(), nil
	case len(values) > 1:
		return "", fmt.Errorf("%w: %d header lines", idemkey.ErrManyKeys, len(values))
	case strings.HasPrefix(strings.TrimLeft(values[0], " \t"), `"`):
		return idemkey.Parse(values)
	}
	k := values[0]
	if len(k) > idemkey.MaxLen {
		return "", fmt.Errorf("%w, got %d", idemkey.ErrInvalidKey, len(k))
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; c < 0x20 || c > 0x7e {
			return "", fmt.Errorf("%w, got byte %#02x at %d", idemkey.ErrInvalidKey, c, i)
		}
	}
	return k, nil
}

// send makes one attempt on a copy of req with a fresh body, under ctx, with header as the
// Idempotency-Key header.
func (c *Client) send(ctx context.Context, req *http.Request, header string) (*http.Response, error) {
	r := req.Clone(ctx)
	if req.GetBody != nil {
		body, err := req.GetBody()
		if err != nil {
			return nil, fmt.Errorf("error replaying the request body: %w", err)
		}
		r.Body = body
	}
	r.Header.Set(HeaderIdempotencyKey, header)
	return c.http.Do(r)
}

// retryableStatus: 409 (the same key is still in flight) and the statuses that mean "the
// same request may succeed later" (408, 425, 429, 5xx). Every other 4xx says the request
// itself is wrong and would fail again.
func retryableStatus(status int) bool {
	return status == http.StatusConflict || retry.Retryable(status)
}

// retryableError: a network error may have happened before or after the server applied
// the operation; the key makes the retry safe either way, and a refused or reset connection
// or a timeout may well pass next time. An error about the request itself would come again
// on every attempt: a certificate the client refuses, an address or port that cannot be
// dialled as written (*net.AddrError), and the requests net/http refuses before sending
// them, which it reports with errors of no exported type (unsupported scheme, no host,
// invalid method or header), recognised by their text.
func retryableError(err error) bool {
	var (
		unknownAuthority x509.UnknownAuthorityError
		hostname         x509.HostnameError
		invalid          x509.CertificateInvalidError
		verify           *tls.CertificateVerificationError
		addr             *net.AddrError
	)
	if errors.As(err, &unknownAuthority) || errors.As(err, &hostname) || errors.As(err, &invalid) ||
		errors.As(err, &verify) || errors.As(err, &addr) {
		return false
	}
	var u *url.Error
	if errors.As(err, &u) {
		msg := u.Err.Error()
		for _, refused := range refusedRequests {
			if strings.HasPrefix(msg, refused) {
				return false
			}
		}
	}
	return true
}

// refusedRequests are the beginnings of the errors with which net/http's Client and
// Transport refuse a request before sending it (transport.go, client.go).
var refusedRequests = []string{
	"unsupported protocol scheme",
	"http: no Host in request URL",
	"http: nil Request.",
	"net/http: invalid method",
	"net/http: invalid header",
	"net/http: invalid trailer",
}

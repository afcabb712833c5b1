package idemclient_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/idemclient"
)

// server answers attempt n (from 1) with answer; it records the key and body of each.
type server struct {
	*httptest.Server
	mu     sync.Mutex
	keys   []string
	bodies []string
	times  []time.Time
}

func newServer(t *testing.T, answer func(w http.ResponseWriter, r *http.Request, n int)) *server {
	t.Helper()
	s := &server{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.keys = append(s.keys, r.Header.Get(idemclient.HeaderIdempotencyKey))
		s.bodies = append(s.bodies, string(body))
		s.times = append(s.times, time.Now())
		n := len(s.keys)
		s.mu.Unlock()
		answer(w, r, n)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *server) seen() (keys, bodies []string, times []time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.keys...), append([]string(nil), s.bodies...), append([]time.Time(nil), s.times...)
}

// drop handles the request and then loses the answer: the connection closes before a byte
// of it is written, as when a proxy or the network fails after the server committed.
func drop(w http.ResponseWriter) {
	conn, _, err := w.(http.Hijacker).Hijack()
	if err == nil {
		conn.Close()
	}
}

// newHangingServer never answers; arrived receives when a request arrives.
func newHangingServer(t *testing.T) (*server, <-chan struct{}) {
	t.Helper()
	block, arrived := make(chan struct{}), make(chan struct{}, 1)
	t.Cleanup(func() { close(block) })
	return newServer(t, func(w http.ResponseWriter, r *http.Request, n int) {
		arrived <- struct{}{}
		select {
		case <-block:
		case <-r.Context().Done():
		}
	}), arrived
}

func newClient(t *testing.T, cfg idemclient.Config) (*idemclient.Client, *[]idemclient.Retry) {
	t.Helper()
	var (
		mu      sync.Mutex
		retries []idemclient.Retry
	)
	cfg.BackoffMin = cmpOr(cfg.BackoffMin, time.Millisecond)
	cfg.BackoffMax = cmpOr(cfg.BackoffMax, 5*time.Millisecond)
	cfg.OnRetry = func(r idemclient.Retry) {
		mu.Lock()
		defer mu.Unlock()
		retries = append(retries, r)
	}
	c, err := idemclient.New(&cfg)
	require.NoError(t, err)
	return c, &retries
}

func cmpOr(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

func post(t *testing.T, url, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	return req
}

// TestDroppedAnswersAreRetriedWithOneKey: the server handles the first attempts but their
// answers are lost; the client retries with the same key and body and returns the answer
// of the attempt that got through.
func TestDroppedAnswersAreRetriedWithOneKey(t *testing.T) {
	t.Parallel()
	s := newServer(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n <= 2 {
			drop(w)
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"order_1"}`))
	})
	c, retries := newClient(t, idemclient.Config{})
	resp, err := c.Do(context.Background(), post(t, s.URL, `{"amount":5}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, `{"id":"order_1"}`, string(body))

	keys, bodies, _ := s.seen()
	require.GreaterOrEqual(t, len(keys), 3)
	for i := range keys {
		require.Equal(t, keys[0], keys[i], "one key for every attempt")
		require.Equal(t, `{"amount":5}`, bodies[i], "the body is replayed on every attempt")
	}
	require.Len(t, keys[0], 36, "a UUID")
	require.Equal(t, keys[0], resp.Request.Header.Get(idemclient.HeaderIdempotencyKey))
	require.Len(t, *retries, 2)
	for _, r := range *retries {
		require.Error(t, r.Err)
		require.Zero(t, r.Status)
	}
}

func TestNoRetryOnOther4xx(t *testing.T) {
	t.Parallel()
	for _, status := range []int{400, 401, 403, 404, 410, 422} {
		s := newServer(t, func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(status) })
		c, retries := newClient(t, idemclient.Config{})
		resp, err := c.Do(context.Background(), post(t, s.URL, `{}`))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, status, resp.StatusCode)
		keys, _, _ := s.seen()
		require.Len(t, keys, 1, "status %d is never retried", status)
		require.Empty(t, *retries)
	}
}

// TestRetryOnConflictTooManyAndUnavailable: 409, 429 and 503 are retried with the same
// key; the wait after each is never shorter than its Retry-After (here 1 s, while the
// backoff alone is at most 5 ms).
func TestRetryOnConflictTooManyAndUnavailable(t *testing.T) {
	t.Parallel()
	statuses := []int{http.StatusConflict, http.StatusTooManyRequests, http.StatusServiceUnavailable}
	s := newServer(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n <= len(statuses) {
			if n == 2 {
				w.Header().Set("Retry-After", "1")
			}
			w.WriteHeader(statuses[n-1])
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	c, retries := newClient(t, idemclient.Config{})
	req := post(t, s.URL, `{}`)
	req.Header.Set(idemclient.HeaderIdempotencyKey, "caller-key-1") // survives a restart of the caller
	resp, err := c.Do(context.Background(), req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	keys, _, times := s.seen()
	require.Equal(t, []string{"caller-key-1", "caller-key-1", "caller-key-1", "caller-key-1"}, keys)
	require.Len(t, *retries, 3)
	for i, r := range *retries {
		require.Equal(t, statuses[i], r.Status)
		require.Equal(t, "caller-key-1", r.Key)
	}
	require.GreaterOrEqual(t, (*retries)[1].Wait, time.Second, "Retry-After honoured")
	require.GreaterOrEqual(t, times[2].Sub(times[1]), time.Second)
}

func TestRetryAfterBeyondTheLimitReturnsTheAnswer(t *testing.T) {
	t.Parallel()
	s := newServer(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Retry-After", time.Now().Add(time.Hour).UTC().Format(http.TimeFormat))
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	c, _ := newClient(t, idemclient.Config{RetryAfterMax: time.Minute})
	resp, err := c.Do(context.Background(), post(t, s.URL, `{}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	keys, _, _ := s.seen()
	require.Len(t, keys, 1)
}

func TestAttemptsExhausted(t *testing.T) {
	t.Parallel()
	s := newServer(t, func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(http.StatusBadGateway) })
	c, _ := newClient(t, idemclient.Config{MaxAttempts: 3})
	resp, err := c.Do(context.Background(), post(t, s.URL, `{}`))
	require.NoError(t, err, "the last answer is returned")
	resp.Body.Close()
	require.Equal(t, http.StatusBadGateway, resp.StatusCode)
	keys, _, _ := s.seen()
	require.Len(t, keys, 3)

	dropping := newServer(t, func(w http.ResponseWriter, r *http.Request, n int) { drop(w) })
	_, err = c.Do(context.Background(), post(t, dropping.URL, `{}`))
	require.ErrorContains(t, err, "attempt 3 of 3")
}

// TestCancellationStopsRetrying: ctx ends during the wait for a long Retry-After; Do
// returns at once with ctx's error.
func TestCancellationStopsRetrying(t *testing.T) {
	t.Parallel()
	s := newServer(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Retry-After", "30")
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	ctx, cancel := context.WithCancel(context.Background())
	cfg := idemclient.Config{OnRetry: func(idemclient.Retry) { cancel() }}
	c, err := idemclient.New(&cfg)
	require.NoError(t, err)
	_, err = c.Do(ctx, post(t, s.URL, `{}`))
	require.ErrorIs(t, err, context.Canceled)
	keys, _, _ := s.seen()
	require.Len(t, keys, 1)

	// And during a request: the server never answers.
	hang, arrived := newHangingServer(t)
	ctx, cancel2 := context.WithCancel(context.Background())
	go func() {
		<-arrived
		cancel2()
	}()
	_, err = c.Do(ctx, post(t, hang.URL, `{}`))
	require.ErrorIs(t, err, context.Canceled)
}

func TestBodyMustBeReplayable(t *testing.T) {
	t.Parallel()
	c, _ := newClient(t, idemclient.Config{})
	req, err := http.NewRequest(http.MethodPost, "http://127.0.0.1:1", io.NopCloser(bytes.NewReader([]byte("x"))))
	require.NoError(t, err)
	_, err = c.Do(context.Background(), req)
	require.True(t, errors.Is(err, idemclient.ErrBodyNotReplayable))
}

func TestNewRefusesBadConfig(t *testing.T) {
	t.Parallel()
	_, err := idemclient.New(&idemclient.Config{MaxAttempts: -1})
	require.ErrorContains(t, err, "MaxAttempts")
	_, err = idemclient.New(&idemclient.Config{BackoffMin: time.Second, BackoffMax: time.Millisecond})
	require.ErrorContains(t, err, "BackoffMax")
}

// TestRequestContextEndsTheOperation: a request made with http.NewRequestWithContext is
// bounded by its context too, during a wait and during an attempt, whichever context ends
// first.
func TestRequestContextEndsTheOperation(t *testing.T) {
	t.Parallel()
	s := newServer(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Retry-After", "30")
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	reqCtx, cancel := context.WithCancel(context.Background())
	cfg := idemclient.Config{MaxAttempts: 2, OnRetry: func(idemclient.Retry) { cancel() }}
	c, err := idemclient.New(&cfg)
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(reqCtx, http.MethodPost, s.URL, strings.NewReader(`{}`))
	require.NoError(t, err)
	// Do's own context only guards the test: without the request's, Do would end with it.
	ctx, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	_, err = c.Do(ctx, req)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorContains(t, err, "waiting after attempt 1")
	keys, _, _ := s.seen()
	require.Len(t, keys, 1)

	// During an attempt: the server never answers.
	hang, arrived := newHangingServer(t)
	reqCtx, cancel2 := context.WithCancel(context.Background())
	go func() {
		<-arrived
		cancel2()
	}()
	req, err = http.NewRequestWithContext(reqCtx, http.MethodPost, hang.URL, strings.NewReader(`{}`))
	require.NoError(t, err)
	_, err = c.Do(ctx, req)
	require.ErrorIs(t, err, context.Canceled)
	require.NoError(t, ctx.Err(), "ended by the request's context, not by Do's")
}

// TestPermanentErrorsAreNotRetried: a request that can never be sent as written fails at
// once; a refused connection is retried.
func TestPermanentErrorsAreNotRetried(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"htp://127.0.0.1:8080/x", "http://127.0.0.1:99999/x", "http:///x"} {
		c, retries := newClient(t, idemclient.Config{MaxAttempts: 3})
		req, err := http.NewRequest(http.MethodPost, u, strings.NewReader(`{}`))
		if err != nil {
			t.Fatalf("%s: %v", u, err)
		}
		_, err = c.Do(context.Background(), req)
		require.ErrorContains(t, err, "attempt 1 of 3", u)
		require.Empty(t, *retries, u)
	}

	// A port nothing listens on: refused now, maybe not later.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	refused := "http://" + l.Addr().String() + "/x"
	require.NoError(t, l.Close())
	c, retries := newClient(t, idemclient.Config{MaxAttempts: 3})
	_, err = c.Do(context.Background(), post(t, refused, `{}`))
	require.ErrorContains(t, err, "attempt 3 of 3")
	require.Len(t, *retries, 2)
}

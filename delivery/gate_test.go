package delivery_test

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/delivery"
	"github.com/idemd/idemd/outbox"
)

// timedEndpoint is an endpoint that answers its i-th request (from 1, all events together)
// status(i), and records when each request came.
func timedEndpoint(t *testing.T, status func(i int) int) (e *endpoint, times func() []time.Time) {
	var (
		mu  sync.Mutex
		got []time.Time
	)
	e = newEndpoint(t, func(w http.ResponseWriter, r *http.Request, n int) {
		mu.Lock()
		got = append(got, time.Now())
		i := len(got)
		mu.Unlock()
		w.WriteHeader(status(i))
	})
	return e, func() []time.Time {
		mu.Lock()
		defer mu.Unlock()
		return append([]time.Time(nil), got...)
	}
}

// TestBreakerOpensAndRecovers: the endpoint fails its first 4 requests. After 3 consecutive
// failures the breaker opens and nothing is sent for the cool-down, even by a deliverer
// started afresh (the state is in PostgreSQL); then one probe goes out, fails, and the
// breaker opens again; the next probe succeeds, the breaker closes, and every waiting event
// is delivered exactly once.
func TestBreakerOpensAndRecovers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	e, times := timedEndpoint(t, func(i int) int {
		if i <= 4 {
			return http.StatusServiceUnavailable
		}
		return http.StatusNoContent
	})
	name := "breaker-" + b.db.Schema
	const coolDown = 400 * time.Millisecond
	ep := endpointConfig(name, e)
	ep.Concurrency = 1
	ep.Breaker = &delivery.Breaker{Failures: 3, CoolDown: coolDown}
	ep.Retry = delivery.RetryPolicy{MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}
	const events = 5
	var evs []outbox.Event
	for i := range events {
		evs = append(evs, event(name, "msg-"+strconv.Itoa(i), "", fmt.Sprintf(`{"n":%d}`, i)))
	}
	b.enqueue(t, evs...)

	_, stop := b.start(t, delivery.Config{Endpoints: []delivery.Endpoint{ep}})
	b.waitFor(t, delivery.Retry, 3)
	stop() // the breaker is open; a new deliverer must honour it
	var open bool
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), b.db.Q(
		`SELECT breaker_open_until > now() FROM {schema}.http_endpoints WHERE name = $1`), name).Scan(&open))
	require.True(t, open, "three consecutive failures open the breaker")
	b.start(t, delivery.Config{Endpoints: []delivery.Endpoint{ep}})
	b.waitFor(t, delivery.Delivered, events)

	got := times()
	require.Len(t, got, 4+events, "3 failures, a failed probe, a good probe, then the others")
	require.GreaterOrEqual(t, got[3].Sub(got[2]), coolDown, "nothing is sent while the breaker is open, across a restart")
	require.GreaterOrEqual(t, got[4].Sub(got[3]), coolDown, "a failed probe opens the breaker again")
	_, accepted, _ := e.snapshot()
	require.Len(t, accepted, events)
	for op, n := range accepted {
		require.Equal(t, 1, n, "event %s accepted once", op)
	}
	require.GreaterOrEqual(t, testutil.ToFloat64(delivery.BreakerTransitions.WithLabelValues(name, "open")), 2.0)
	require.Equal(t, 2.0, testutil.ToFloat64(delivery.BreakerTransitions.WithLabelValues(name, "half_open")))
	require.Equal(t, 1.0, testutil.ToFloat64(delivery.BreakerTransitions.WithLabelValues(name, "closed")))
	require.Equal(t, 0.0, testutil.ToFloat64(delivery.BreakerOpenGauge.WithLabelValues(name)))
	var failures int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), b.db.Q(
		`SELECT breaker_failures FROM {schema}.http_endpoints WHERE name = $1 AND breaker_open_until IS NULL AND breaker_probe_until IS NULL`), name).Scan(&failures))
	require.Zero(t, failures, "closed")
}

// TestRateLimit: an endpoint with rate 5 receives its 12 events no faster than its budget
// allows (5 at once, then 5 per second), shared by two deliverers.
func TestRateLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	e, times := timedEndpoint(t, func(int) int { return http.StatusNoContent })
	const rate, events = 5.0, 12
	ep := endpointConfig("rated-"+b.db.Schema, e)
	ep.Rate = rate
	ep.Concurrency = 8
	var evs []outbox.Event
	for i := range events {
		evs = append(evs, event(ep.Name, "msg-"+strconv.Itoa(i), "", `{}`))
	}
	b.enqueue(t, evs...)
	b.start(t, delivery.Config{Endpoints: []delivery.Endpoint{ep}})
	b.start(t, delivery.Config{Endpoints: []delivery.Endpoint{ep}})
	b.waitFor(t, delivery.Delivered, events)

	got := times()
	sort.Slice(got, func(i, j int) bool { return got[i].Before(got[j]) })
	require.Len(t, got, events)
	// Token bucket: by the (n+1)-th request, at most capacity + rate × elapsed were allowed
	// (one more for the clocks of the database and of this process).
	for n := range got {
		allowed := rate + rate*got[n].Sub(got[0]).Seconds() + 1
		require.LessOrEqual(t, float64(n+1), allowed, "request %d came %s after the first", n+1, got[n].Sub(got[0]))
	}
}

// TestEndpointRetryPolicy: each endpoint has its own retry policy: the strict endpoint
// dead-letters after 2 attempts while the lenient one, failing the same way, keeps trying.
func TestEndpointRetryPolicy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	failing := func(w http.ResponseWriter, r *http.Request, n int) {
		if n <= 3 {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		w.WriteHeader(http.StatusOK)
	}
	strict, lenient := endpointConfig("strict", newEndpoint(t, failing)), endpointConfig("lenient", newEndpoint(t, failing))
	strict.Retry = delivery.RetryPolicy{MaxAttempts: 2}
	b.enqueue(t, event("strict", "m1", "", `{}`), event("lenient", "m2", "", `{}`))
	b.start(t, delivery.Config{Endpoints: []delivery.Endpoint{strict, lenient}, MaxAttempts: 10})
	var dead, delivered []delivery.Attempt
	for len(dead) < 1 || len(delivered) < 1 {
		select {
		case a := <-b.attempts:
			switch a.Outcome {
			case delivery.DeadLettered:
				dead = append(dead, a)
			case delivery.Delivered:
				delivered = append(delivered, a)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("timed out")
		}
	}
	require.Equal(t, "strict", dead[0].Endpoint)
	require.Equal(t, 2, dead[0].Number)
	require.Equal(t, "lenient", delivered[0].Endpoint)
	require.Equal(t, 4, delivered[0].Number)
}

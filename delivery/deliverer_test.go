package delivery_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/delivery"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/outbox"
)

const testSecret = vectorSecret

// request is what the test endpoint saw of one attempt.
type request struct {
	key, id, ts, sig, contentType string
	body                          []byte
	at                            time.Time
}

// endpoint is a local HTTP endpoint whose answer to each attempt is chosen by a function
// of the attempt number of that Idempotency-Key (from 1) and the request.
type endpoint struct {
	srv *httptest.Server

	mu       sync.Mutex
	attempts map[string][]request // by Idempotency-Key
	accepted map[string]int       // 2xx answers by Idempotency-Key
	order    map[string][]string  // accepted bodies by event key (the "key" header)
	inflight map[string]int       // requests in flight by event key
	overlap  atomic.Bool          // two requests of one event key were in flight at once
}

type answer func(w http.ResponseWriter, r *http.Request, n int)

func newEndpoint(t *testing.T, answer answer) *endpoint {
	t.Helper()
	e := &endpoint{attempts: map[string][]request{}, accepted: map[string]int{}, order: map[string][]string{}, inflight: map[string]int{}}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		ek := r.Header.Get("X-Test-Key")
		e.mu.Lock()
		key := r.Header.Get(delivery.HeaderIdempotencyKey)
		e.attempts[key] = append(e.attempts[key], request{
			key: key, id: r.Header.Get("webhook-id"), ts: r.Header.Get("webhook-timestamp"),
			sig: r.Header.Get("webhook-signature"), contentType: r.Header.Get("Content-Type"),
			body: body, at: time.Now(),
		})
		n := len(e.attempts[key])
		e.inflight[ek]++
		if ek != "" && e.inflight[ek] > 1 {
			e.overlap.Store(true)
		}
		e.mu.Unlock()
		rec := &statusRecorder{ResponseWriter: w}
		answer(rec, r, n)
		e.mu.Lock()
		e.inflight[ek]--
		if rec.status >= 200 && rec.status <= 299 {
			e.accepted[key]++
			e.order[ek] = append(e.order[ek], string(body))
		}
		e.mu.Unlock()
	}))
	t.Cleanup(e.srv.Close)
	return e
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (e *endpoint) snapshot() (attempts map[string][]request, accepted map[string]int, order map[string][]string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	attempts, accepted, order = map[string][]request{}, map[string]int{}, map[string][]string{}
	for k, v := range e.attempts {
		attempts[k] = append([]request(nil), v...)
	}
	for k, v := range e.accepted {
		accepted[k] = v
	}
	for k, v := range e.order {
		order[k] = append([]string(nil), v...)
	}
	return attempts, accepted, order
}

type bundle struct {
	db    *pgtest.DB
	store *outbox.Store
	// attempts receives every attempt the deliverers of this test record.
	attempts chan delivery.Attempt
}

func setup(t *testing.T) *bundle {
	t.Helper()
	db := pgtest.NewWithOptions(t, pgtest.Options{MaxConns: 6})
	return &bundle{db: db, store: outbox.New(&outbox.Config{Schema: db.Schema}), attempts: make(chan delivery.Attempt, 10000)}
}

func quietLogger() *logrus.Entry {
	l := logrus.New()
	l.SetLevel(logrus.FatalLevel)
	return logrus.NewEntry(l)
}

// start runs a deliverer until stop or the end of the test; its EndpointState signal is
// initialised.
func (b *bundle) start(t *testing.T, cfg delivery.Config) (d *delivery.Deliverer, stop func()) {
	t.Helper()
	cfg.Schema = b.db.Schema
	cfg.Logger = cmpOr(cfg.Logger, quietLogger())
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 200 * time.Millisecond
	}
	if cfg.BackoffMin == 0 {
		cfg.BackoffMin, cfg.BackoffMax = time.Millisecond, 20*time.Millisecond
	}
	cfg.AfterAttempt = func(a delivery.Attempt) { b.attempts <- a }
	d, err := delivery.NewDeliverer(b.db.Pool, &cfg)
	require.NoError(t, err)
	d.TestSignals().EndpointState.Init(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = d.Run(ctx)
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return d, stop
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

func endpointConfig(name string, e *endpoint) delivery.Endpoint {
	return delivery.Endpoint{Name: name, URL: e.srv.URL, Secret: testSecret, Timeout: 2 * time.Second}
}

// event is an HTTP-only event of endpoint name; key "" means no key.
func event(name, causation, key string, body string) outbox.Event {
	ev := outbox.Event{Endpoint: name, Pipeline: "p", CausationID: causation, Payload: []byte(body),
		Headers: map[string]string{outbox.HeaderContentType: "application/json"}}
	if key != "" {
		ev.Key = []byte(key)
	}
	return ev
}

func (b *bundle) enqueue(t *testing.T, events ...outbox.Event) {
	t.Helper()
	ctx := context.Background()
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, b.store.EnqueueTx(ctx, tx, events...))
	require.NoError(t, tx.Commit(ctx))
}

// waitFor reads attempts until n of them had outcome, and returns every attempt read.
func (b *bundle) waitFor(t *testing.T, outcome delivery.Outcome, n int) []delivery.Attempt {
	t.Helper()
	var seen []delivery.Attempt
	deadline := time.After(60 * time.Second)
	for got := 0; got < n; {
		select {
		case a := <-b.attempts:
			seen = append(seen, a)
			if a.Outcome == outcome {
				got++
			}
		case <-deadline:
			t.Fatalf("waited for %d %s attempts, saw %d; attempts: %+v", n, outcome, len(seen), seen)
		}
	}
	return seen
}

// TestDeliveryRetriesUntilAccepted: the endpoint fails the first attempts with 503 and
// 500, times out once, then accepts. Each event is accepted exactly once, every attempt
// carried the same Idempotency-Key (= webhook-id = the operation id) and a signature that
// verifies with the secret.
func TestDeliveryRetriesUntilAccepted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	e := newEndpoint(t, func(w http.ResponseWriter, r *http.Request, n int) {
		switch n {
		case 1:
			w.WriteHeader(http.StatusServiceUnavailable)
		case 2:
			w.WriteHeader(http.StatusInternalServerError)
		case 3:
			<-r.Context().Done() // the deliverer's timeout ends it
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	})
	ep := endpointConfig("partner", e)
	ep.Timeout = 300 * time.Millisecond
	const events = 6
	var evs []outbox.Event
	for i := range events {
		evs = append(evs, event("partner", "msg-"+strconv.Itoa(i), "k"+strconv.Itoa(i%2), fmt.Sprintf(`{"n":%d}`, i)))
	}
	b.enqueue(t, evs...)
	b.start(t, delivery.Config{Endpoints: []delivery.Endpoint{ep}})
	seen := b.waitFor(t, delivery.Delivered, events)

	timeouts := 0
	for _, a := range seen {
		if a.Outcome == delivery.Retry && a.Status == 0 {
			timeouts++
			require.ErrorIs(t, a.Err, context.DeadlineExceeded)
		}
	}
	require.Equal(t, events, timeouts, "one timeout per event")

	attempts, accepted, _ := e.snapshot()
	require.Len(t, attempts, events)
	for i := range events {
		op := outbox.OperationID("p", "msg-"+strconv.Itoa(i), i).String() // i-th event of one EnqueueTx
		require.Equal(t, 1, accepted[op], "exactly one accepted delivery of event %d", i)
		require.Len(t, attempts[op], 4, "503, 500, timeout, 204")
		for _, r := range attempts[op] {
			require.Equal(t, op, r.key, "every attempt carries the same Idempotency-Key")
			require.Equal(t, op, r.id, "webhook-id is the operation id")
			require.Equal(t, "application/json", r.contentType)
			require.Equal(t, fmt.Sprintf(`{"n":%d}`, i), string(r.body))
			require.True(t, verifyIndependently(t, testSecret, r.id, r.ts, r.body, r.sig), "signature of %+v", r)
		}
	}
	require.Equal(t, events, b.db.Count(t, "{schema}.http_deliveries WHERE state = 'delivered' AND attempts = 4 AND last_error IS NULL"))
	require.Zero(t, b.db.Count(t, "{schema}.outbox"), "HTTP-only events never reach the Kafka outbox")
}

// TestGoneDisablesEndpoint: a 410 disables the endpoint (persisted, metric); its events
// stay queued, untried, until an operator re-enables it; then they are delivered.
func TestGoneDisablesEndpoint(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var gone atomic.Bool
	gone.Store(true)
	e := newEndpoint(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if gone.Load() {
			w.WriteHeader(http.StatusGone)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	name := "gone-" + b.db.Schema // the metric is process-wide: one label per test
	ep := endpointConfig(name, e)
	ep.Concurrency = 1
	b.enqueue(t, event(name, "m1", "", `{}`), event(name, "m2", "", `{}`), event(name, "m3", "", `{}`))
	logger, logs := logtest.NewNullLogger()
	d, _ := b.start(t, delivery.Config{Endpoints: []delivery.Endpoint{ep}, Logger: logrus.NewEntry(logger)})
	b.waitFor(t, delivery.Disabled, 1)
	d.TestSignals().EndpointState.WaitFor(t, "the endpoint disabled", func(s delivery.EndpointSignal) bool { return s.Disabled })
	// The log tells operators how to re-enable it with what they have: the admin API and
	// the console.
	var told int
	for _, e := range logs.AllEntries() {
		if e.Level == logrus.ErrorLevel {
			require.Equal(t, "POST /api/v1/endpoints/"+name+"/enable on the admin address, or Enable on the console's Deliveries page (/ui/deliveries)", e.Data["re_enable"], e.Message)
			told++
		}
	}
	require.Equal(t, 2, told, "the 410, and the loop seeing the endpoint disabled")
	require.EqualValues(t, 1, testutil.ToFloat64(delivery.EndpointDisabledGauge.WithLabelValues(name)))

	store := delivery.NewStore(b.db.Schema)
	ctx := context.Background()
	disabled, reason, err := store.Disabled(ctx, b.db.Pool, name)
	require.NoError(t, err)
	require.True(t, disabled)
	require.Contains(t, reason, "410")
	require.Equal(t, 3, b.db.Count(t, "{schema}.http_deliveries WHERE state = 'pending'"), "nothing is lost or dead-lettered")
	require.Zero(t, b.db.Count(t, "{schema}.dead_letters"))

	// A restart keeps it disabled: the state is in the database. Its backlog and the age of
	// its oldest pending event are exported for the alerts.
	b.start(t, delivery.Config{Endpoints: []delivery.Endpoint{ep}})
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(delivery.BacklogGauge.WithLabelValues(name)) == 3 &&
			testutil.ToFloat64(delivery.OldestPendingGauge.WithLabelValues(name)) > 0
	}, 10*time.Second, 10*time.Millisecond)

	gone.Store(false)
	require.NoError(t, store.Enable(ctx, b.db.Pool, name))
	b.waitFor(t, delivery.Delivered, 3)
	attempts, accepted, _ := e.snapshot()
	total := 0
	for _, a := range attempts {
		total += len(a)
	}
	require.Equal(t, 4, total, "one 410, then nothing until re-enabled, then one attempt per event")
	require.Len(t, accepted, 3)
	require.Equal(t, 3, b.db.Count(t, "{schema}.http_deliveries WHERE state = 'delivered'"))
	require.ErrorIs(t, store.Enable(ctx, b.db.Pool, "nope"), delivery.ErrNotFound)
}

// TestBadRequestDeadLetters: a 400 is not retried; the event is dead-lettered with the
// status in the reason, and the next event of its key goes on.
func TestBadRequestDeadLetters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	e := newEndpoint(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if r.Header.Get("event-type") == "bad" {
			http.Error(w, "amount is missing", http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	bad := event("partner", "m1", "k", `{"bad":true}`)
	bad.Headers[outbox.HeaderEventType] = "bad"
	b.enqueue(t, bad, event("partner", "m1", "k", `{"good":true}`))
	b.start(t, delivery.Config{Endpoints: []delivery.Endpoint{endpointConfig("partner", e)}})
	b.waitFor(t, delivery.Delivered, 1)

	attempts, _, order := e.snapshot()
	require.Len(t, attempts[outbox.OperationID("p", "m1", 0).String()], 1, "a 400 is never retried")
	require.Equal(t, []string{`{"good":true}`}, order[""])
	letters, err := deadletter.New(b.db.Schema).List(context.Background(), b.db.Pool, deadletter.Filter{})
	require.NoError(t, err)
	require.Len(t, letters, 1)
	l := letters[0]
	require.Contains(t, l.Reason, "400")
	require.Contains(t, l.Reason, "amount is missing")
	require.Equal(t, outbox.OperationID("p", "m1", 0).String(), l.MessageID)
	require.Equal(t, "http:partner", l.Scope)
	require.Equal(t, `{"bad":true}`, string(l.Payload))
	require.Equal(t, 1, l.Attempts)
	require.EqualValues(t, 400, l.Metadata["status"])
	require.Equal(t, 1, b.db.Count(t, "{schema}.http_deliveries WHERE state = 'dead' AND last_status = 400"))
}

// TestRetriesExhaustedDeadLetter: an endpoint that always fails dead-letters the event after
// MaxAttempts.
func TestRetriesExhaustedDeadLetter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var up atomic.Bool
	e := newEndpoint(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if up.Load() {
			w.WriteHeader(http.StatusOK)
			return
		}
		w.WriteHeader(http.StatusBadGateway)
	})
	b.enqueue(t, event("partner", "m1", "", `{}`))
	b.start(t, delivery.Config{Endpoints: []delivery.Endpoint{endpointConfig("partner", e)}, MaxAttempts: 3})
	b.waitFor(t, delivery.DeadLettered, 1)
	attempts, _, _ := e.snapshot()
	require.Len(t, attempts[outbox.OperationID("p", "m1", 0).String()], 3)
	require.Equal(t, 1, b.db.Count(t, "{schema}.http_deliveries WHERE state = 'dead' AND attempts = 3"))
	letters, err := deadletter.New(b.db.Schema).List(context.Background(), b.db.Pool, deadletter.Filter{})
	require.NoError(t, err)
	require.Len(t, letters, 1)
	require.Contains(t, letters[0].Reason, "retries exhausted after 3 attempts")
	require.Contains(t, letters[0].Reason, "502")

	// The endpoint recovered; an operator requeues the event, with the same key.
	up.Store(true)
	var id int64
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), b.db.Q("SELECT id FROM {schema}.http_deliveries")).Scan(&id))
	require.NoError(t, delivery.NewStore(b.db.Schema).Requeue(context.Background(), b.db.Pool, id))
	b.waitFor(t, delivery.Delivered, 1)
	attempts, accepted, _ := e.snapshot()
	require.Len(t, attempts[outbox.OperationID("p", "m1", 0).String()], 4)
	require.Equal(t, 1, accepted[outbox.OperationID("p", "m1", 0).String()])
}

// TestRestartMidRetryLosesNothing: the deliverer stops while an event waits for its retry;
// a new deliverer delivers it, exactly once, with the same key.
func TestRestartMidRetryLosesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	e := newEndpoint(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	cfg := delivery.Config{Endpoints: []delivery.Endpoint{endpointConfig("partner", e)}}
	b.enqueue(t, event("partner", "m1", "k", `{"a":1}`), event("partner", "m2", "k", `{"a":2}`))
	_, stop := b.start(t, cfg)
	b.waitFor(t, delivery.Retry, 1)
	stop() // during the Retry-After wait

	attempts, accepted, _ := e.snapshot()
	require.Len(t, attempts, 1, "the second event of the key waits behind the first")
	require.Empty(t, accepted)
	require.Equal(t, 1, b.db.Count(t, "{schema}.http_deliveries WHERE state = 'pending' AND attempts = 1 AND last_status = 503 AND next_attempt_at > created_at AND lease_until IS NULL"))

	b.start(t, cfg)
	b.waitFor(t, delivery.Delivered, 2)
	attempts, accepted, order := e.snapshot()
	op1 := outbox.OperationID("p", "m1", 0).String()
	require.Len(t, attempts[op1], 2)
	require.Equal(t, attempts[op1][0].key, attempts[op1][1].key)
	require.Equal(t, map[string]int{op1: 1, outbox.OperationID("p", "m2", 1).String(): 1}, accepted)
	require.Equal(t, []string{`{"a":1}`, `{"a":2}`}, order[""])
}

// TestRetryAfterHonoured: with a tiny backoff, the wait after a 429 or 503 still follows
// Retry-After, in seconds or as an HTTP date.
func TestRetryAfterHonoured(t *testing.T) {
	t.Parallel()
	for _, form := range []string{"seconds", "date"} {
		t.Run(form, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			e := newEndpoint(t, func(w http.ResponseWriter, r *http.Request, n int) {
				if n == 1 {
					ra := "1"
					if form == "date" {
						ra = time.Now().Add(2 * time.Second).UTC().Format(http.TimeFormat)
					}
					w.Header().Set("Retry-After", ra)
					w.WriteHeader(http.StatusTooManyRequests)
					return
				}
				w.WriteHeader(http.StatusOK)
			})
			b.enqueue(t, event("partner", "m1", "", `{}`))
			b.start(t, delivery.Config{Endpoints: []delivery.Endpoint{endpointConfig("partner", e)}})
			seen := b.waitFor(t, delivery.Delivered, 1)
			require.Equal(t, delivery.Retry, seen[0].Outcome)
			require.Equal(t, 429, seen[0].Status)
			// The HTTP date has a resolution of one second: at least 1 s of the 2 remain.
			require.GreaterOrEqual(t, seen[0].RetryIn, time.Second, "the backoff alone is at most 1 ms")
			attempts, _, _ := e.snapshot()
			a := attempts[outbox.OperationID("p", "m1", 0).String()]
			require.Len(t, a, 2)
			// Lower bound only: the retry cannot come before the recorded wait.
			require.GreaterOrEqual(t, a[1].at.Sub(a[0].at), seen[0].RetryIn-50*time.Millisecond)
		})
	}
}

// TestPerKeyOrderingAcrossDeliverers: two deliverers share an endpoint that fails at
// random; events of one key are accepted in enqueue order and never overlap in flight,
// and every event is accepted exactly once.
func TestPerKeyOrderingAcrossDeliverers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	e := newEndpoint(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if rand.N(3) == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	const keys, perKey = 5, 12
	for i := range perKey {
		// One transaction per round, as independent messages would commit.
		var evs []outbox.Event
		for k := range keys {
			ev := event("partner", fmt.Sprintf("m-%d-%d", k, i), "key-"+strconv.Itoa(k), fmt.Sprintf("%d", i))
			ev.Headers["x"] = "y"
			evs = append(evs, ev)
		}
		b.enqueue(t, evs...)
	}
	// The endpoint reads the event key from a header the test adds through a transport.
	client := &http.Client{Transport: keyHeader{}}
	cfg := delivery.Config{Endpoints: []delivery.Endpoint{endpointConfig("partner", e)}, HTTPClient: client}
	b.start(t, cfg)
	b.start(t, cfg)
	b.waitFor(t, delivery.Delivered, keys*perKey)

	_, accepted, order := e.snapshot()
	require.False(t, e.overlap.Load(), "two events of one key were in flight at once")
	require.Len(t, accepted, keys*perKey)
	for op, n := range accepted {
		require.Equal(t, 1, n, op)
	}
	for k := range keys {
		var want []string
		for i := range perKey {
			want = append(want, strconv.Itoa(i))
		}
		require.Equal(t, want, order["key-"+strconv.Itoa(k)], "order of key %d", k)
	}
}

// keyHeader copies the event key, which the test puts in the causation id, into a header
// the endpoint groups by.
type keyHeader struct{}

func (keyHeader) RoundTrip(r *http.Request) (*http.Response, error) {
	c := r.Header.Get(outbox.HeaderCausationID) // m-<key>-<i>
	var k, i int
	if _, err := fmt.Sscanf(c, "m-%d-%d", &k, &i); err == nil {
		r = r.Clone(r.Context())
		r.Header.Set("X-Test-Key", "key-"+strconv.Itoa(k))
	}
	return http.DefaultTransport.RoundTrip(r)
}

func TestNewDelivererNamesTheBadField(t *testing.T) {
	t.Parallel()
	db := pgtest.Pool(t, 1)
	cases := map[string]delivery.Config{
		"Endpoints is required": {},
		"Endpoints[0].Name":     {Endpoints: []delivery.Endpoint{{URL: "http://x", Secret: testSecret}}},
		`"a": URL`:              {Endpoints: []delivery.Endpoint{{Name: "a", URL: "ftp://x", Secret: testSecret}}},
		`"a": Secret`:           {Endpoints: []delivery.Endpoint{{Name: "a", URL: "http://x", Secret: "whsec_***"}}},
		"used twice": {Endpoints: []delivery.Endpoint{
			{Name: "a", URL: "http://x", Secret: testSecret}, {Name: "a", URL: "http://y", Secret: testSecret}}},
	}
	for want, cfg := range cases {
		_, err := delivery.NewDeliverer(db, &cfg)
		require.ErrorContains(t, err, want)
	}
}

// TestConcurrencyPerEndpoint: keyless events go in parallel up to Concurrency, never more.
func TestConcurrencyPerEndpoint(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const concurrency = 3
	var (
		mu                      sync.Mutex
		inflight, peak, arrived int
		all                     = make(chan struct{})
	)
	e := newEndpoint(t, func(w http.ResponseWriter, r *http.Request, n int) {
		mu.Lock()
		inflight++
		peak = max(peak, inflight)
		arrived++
		if arrived == concurrency {
			close(all)
		}
		mu.Unlock()
		<-all // the first requests are answered only once all of them are in flight
		w.WriteHeader(http.StatusOK)
		mu.Lock()
		inflight--
		mu.Unlock()
	})
	var evs []outbox.Event
	for i := range 3 * concurrency {
		evs = append(evs, event("partner", "m"+strconv.Itoa(i), "", `{}`))
	}
	b.enqueue(t, evs...)
	ep := endpointConfig("partner", e)
	ep.Concurrency = concurrency
	b.start(t, delivery.Config{Endpoints: []delivery.Endpoint{ep}})
	b.waitFor(t, delivery.Delivered, len(evs))
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, concurrency, peak)
}

// TestLeaseOfADeadDelivererRunsOut: a deliverer died mid-request, its row still leased;
// another one delivers it once the lease ran out, with the same key.
func TestLeaseOfADeadDelivererRunsOut(t *testing.T) {
	t.Parallel()
	b := setup(t)
	e := newEndpoint(t, func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(http.StatusOK) })
	b.enqueue(t, event("partner", "m1", "k", `{}`), event("partner", "m2", "k", `{}`))
	// What a claim leaves behind when its process dies before recording the outcome.
	b.db.Exec(t, b.db.Q(`UPDATE {schema}.http_deliveries SET attempts = 1, lease_token = gen_random_uuid(),
		lease_until = now() + interval '300 milliseconds' WHERE causation_id = 'm1'`))
	b.start(t, delivery.Config{Endpoints: []delivery.Endpoint{endpointConfig("partner", e)}, PollInterval: 50 * time.Millisecond})
	seen := b.waitFor(t, delivery.Delivered, 2)
	require.Equal(t, outbox.OperationID("p", "m1", 0), seen[0].OperationID, "the key's order holds")
	require.Equal(t, 2, seen[0].Number)
	require.Equal(t, 1, b.db.Count(t, "{schema}.http_deliveries WHERE causation_id = 'm1' AND state = 'delivered' AND attempts = 2"))
}

// TestOtherRefusalsDeadLetter: every 4xx but 408, 425, 429 (and 410, which disables the
// endpoint) is a refusal for good (SPEC 2.6b): one attempt, then a dead letter.
func TestOtherRefusalsDeadLetter(t *testing.T) {
	t.Parallel()
	for _, status := range []int{http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound, http.StatusConflict, http.StatusUnprocessableEntity} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			e := newEndpoint(t, func(w http.ResponseWriter, r *http.Request, n int) {
				http.Error(w, http.StatusText(status), status)
			})
			b.enqueue(t, event("partner", "m1", "k", `{"n":1}`))
			b.start(t, delivery.Config{Endpoints: []delivery.Endpoint{endpointConfig("partner", e)}})
			b.waitFor(t, delivery.DeadLettered, 1)
			attempts, _, _ := e.snapshot()
			require.Len(t, attempts[outbox.OperationID("p", "m1", 0).String()], 1, "a %d is never retried", status)
			require.Equal(t, 1, b.db.Count(t, "{schema}.http_deliveries WHERE state = 'dead' AND last_status = $1", status))
		})
	}
}

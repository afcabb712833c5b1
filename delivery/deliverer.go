// Package delivery POSTs outbox events to HTTP endpoints (publish: {http: …}).
// Guarantee: every committed event with an endpoint is delivered at least once, with an
// Idempotency-Key and a Standard Webhooks webhook-id equal to its operation id on every
// attempt, so an endpoint that dedupes on either applies it exactly once; or, when the
// endpoint refuses it for good (a 4xx other than 408/425/429, or the retry budget ran
// out), it is dead-lettered. An endpoint that answers 410 Gone is disabled and its events
// wait, queued, until an operator re-enables it. All state (attempts, next attempt, last
// error, outcome, disabled endpoints) lives in PostgreSQL, so a restart loses nothing.
//
// Events of one key are delivered one after another in id order; events without a key, or
// of different keys, in parallel up to the endpoint's Concurrency.
package delivery

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sirupsen/logrus"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/net/http/httpguts"

	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/internal/retry"
	"github.com/idemd/idemd/internal/testsignal"
	"github.com/idemd/idemd/internal/tracing"
	"github.com/idemd/idemd/migrations"
	"github.com/idemd/idemd/outbox"
)

// Defaults of Config and Endpoint.
const (
	TimeoutDefault       = 10 * time.Second
	ConcurrencyDefault   = 4
	MaxAttemptsDefault   = 20
	MaxAgeDefault        = 24 * time.Hour
	BackoffMinDefault    = 5 * time.Second
	BackoffMaxDefault    = 2 * time.Hour
	PollIntervalDefault  = time.Second
	LeaseMarginDefault   = 30 * time.Second
	StatsIntervalDefault = 5 * time.Second
)

// Endpoint is one destination of outbox events.
type Endpoint struct {
	// Name identifies the endpoint; outbox events name it in Event.Endpoint. The daemon
	// uses the pipeline's name. Required.
	Name string
	// URL receives the POSTs; http or https. Its path and query are often a capability
	// (a secret), so only its scheme, host and port are ever logged or stored (last_error,
	// dead letters, http_endpoints). Required.
	URL string
	// Secret signs every request per Standard Webhooks: "whsec_" and base64. Required.
	Secret string
	// Timeout bounds one attempt, connection to last byte of the answer's head. Defaults
	// to 10 s.
	Timeout time.Duration
	// Concurrency is how many requests this process has in flight to the endpoint at once.
	// Defaults to 4.
	Concurrency int
	// Retry overrides the Config's retry policy for this endpoint, field by field. Defaults
	// to the Config's.
	Retry RetryPolicy
	// Rate caps the requests per second to this endpoint, all deliverers together: the
	// budget (a token bucket of Rate tokens, refilled at Rate per second, at least one)
	// lives in PostgreSQL. Retries count. Defaults to 0: no cap.
	Rate float64
	// Breaker, when set, stops sending to the endpoint while it keeps failing (see
	// Breaker). Defaults to nil: only a 410 stops deliveries.
	Breaker *Breaker
}

// Outcome is what became of one attempt.
type Outcome string

// Outcomes of an attempt.
const (
	// Delivered: the endpoint answered 2xx.
	Delivered Outcome = "delivered"
	// Retry: a transient failure; another attempt is scheduled.
	Retry Outcome = "retry"
	// DeadLettered: refused for good, or the retry budget ran out.
	DeadLettered Outcome = "dead_lettered"
	// Disabled: the endpoint answered 410 Gone; the event stays queued.
	Disabled Outcome = "disabled"
)

// Attempt describes one finished attempt, for the AfterAttempt hook.
type Attempt struct {
	DeliveryID  int64
	Endpoint    string
	OperationID uuid.UUID
	// Number counts attempts of this delivery, from 1.
	Number int
	// Status is the HTTP status, 0 when no answer came (Err says why).
	Status int
	Err    error
	// Outcome is what was recorded.
	Outcome Outcome
	// RetryIn is the wait before the next attempt, when Outcome is Retry.
	RetryIn time.Duration
}

// Config configures a Deliverer.
type Config struct {
	// Schema holds the http_deliveries table. Defaults to "idemd".
	Schema string
	// Endpoints are the destinations this deliverer serves; rows of other endpoints wait
	// for a deliverer that knows them. Required.
	Endpoints []Endpoint
	// MaxAttempts bounds the attempts per event before it is dead-lettered. Defaults to 20.
	MaxAttempts int
	// MaxAge bounds how long after it was enqueued an event is retried; a retry that would
	// start later dead-letters it instead. Defaults to 24 h.
	MaxAge time.Duration
	// BackoffMin and BackoffMax bound the retry wait: full jitter over
	// min(BackoffMax, BackoffMin·2^(attempts-1)), and never less than Retry-After.
	// Defaults to 5 s and 2 h.
	BackoffMin, BackoffMax time.Duration
	// PollInterval is how often the deliverer looks for due rows when nothing woke it; it
	// bounds the delay of a lost NOTIFY and of a re-enabled endpoint. Defaults to 1 s.
	PollInterval time.Duration
	// LeaseMargin is added to the endpoint's Timeout to form the lease of a claimed row: if
	// this process dies mid-request, another deliverer retries the row after the lease.
	// Defaults to 30 s.
	LeaseMargin time.Duration
	// StatsInterval is how often the backlog gauge is refreshed. Defaults to 5 s.
	StatsInterval time.Duration
	// HTTPClient sends the requests; redirects are not followed (a 3xx is a refusal).
	// Defaults to a client on a clone of http.DefaultTransport.
	HTTPClient *http.Client
	// Now is the clock of the webhook-timestamp header. Defaults to time.Now.
	Now func() time.Time
	// Logger receives the deliverer's logs. Defaults to logrus's standard logger.
	Logger *logrus.Entry
	// AfterAttempt, when set, runs after each attempt's outcome is recorded. For tests.
	AfterAttempt func(Attempt)
	// TracerProvider records a client span per attempt, continuing the trace stored with
	// the event; each request carries its traceparent (trace.go). Defaults to
	// OpenTelemetry's global provider; while that is a no-op one (tracing off), no span is
	// made and requests carry the stored traceparent.
	TracerProvider trace.TracerProvider
}

// Deliverer delivers pending http_deliveries rows of its endpoints. Several deliverers,
// in one process or many, share the work safely: each claims rows with FOR UPDATE SKIP
// LOCKED and a lease, and a row is claimable only when no earlier pending row has its
// key, so per-key order holds across processes too.
type Deliverer struct {
	pool       *pgxpool.Pool
	cfg        Config
	endpoints  []*endpoint
	client     *http.Client
	log        *logrus.Entry
	channel    string
	deadletter *deadletter.Store
	sql        statements
	signals    delivererSignals
	tracer     *tracing.Tracer
}

// delivererSignals are the deliverer's test signals (internal/testsignal): inert unless a
// test initialised them before Run. (Attempts are reported through Config.AfterAttempt.)
type delivererSignals struct {
	// EndpointState is signalled when an endpoint loop sees its endpoint disabled or
	// enabled again (and has set the gauge).
	EndpointState testsignal.Signal[endpointState]
}

// endpointState is an endpoint's state as its loop saw it change.
type endpointState struct {
	Endpoint string
	Disabled bool
}

type endpoint struct {
	Endpoint
	key []byte
	// redacted is the URL as logged and stored: scheme://host[:port]. Paths and queries
	// are often capabilities (/services/T/B/<secret>, ?token=…).
	redacted string
	wake     chan struct{}
}

// redactURL keeps the scheme, host and port of u: the rest may be a secret.
func redactURL(u *url.URL) string { return u.Scheme + "://" + u.Host }

type statements struct {
	upsertEndpoint, status, claim, nextDue, backlog string
	delivered, retry, dead, release, disable        string
	// The gate of endpoints with a Rate or a Breaker (gate.go).
	gate, gateUpdate, breakerFail, breakerClose, breakerRelease string
}

// NewDeliverer returns a deliverer on pool; call Run.
func NewDeliverer(pool *pgxpool.Pool, cfg *Config) (*Deliverer, error) {
	if pool == nil {
		return nil, errors.New("delivery: NewDeliverer: pool is required")
	}
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	c.Schema = cmp.Or(c.Schema, migrations.SchemaDefault)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, MaxAttemptsDefault)
	c.MaxAge = cmp.Or(c.MaxAge, MaxAgeDefault)
	c.BackoffMin = cmp.Or(c.BackoffMin, BackoffMinDefault)
	c.BackoffMax = cmp.Or(c.BackoffMax, BackoffMaxDefault)
	c.PollInterval = cmp.Or(c.PollInterval, PollIntervalDefault)
	c.LeaseMargin = cmp.Or(c.LeaseMargin, LeaseMarginDefault)
	c.StatsInterval = cmp.Or(c.StatsInterval, StatsIntervalDefault)
	switch {
	case len(c.Endpoints) == 0:
		return nil, errors.New("delivery: Config.Endpoints is required")
	case c.MaxAttempts < 1:
		return nil, fmt.Errorf("delivery: Config.MaxAttempts must be positive, got %d", c.MaxAttempts)
	case c.MaxAge < 0:
		return nil, fmt.Errorf("delivery: Config.MaxAge must be positive, got %s", c.MaxAge)
	case c.BackoffMin < 0 || c.BackoffMax < c.BackoffMin:
		return nil, fmt.Errorf("delivery: Config.BackoffMax (%s) is below BackoffMin (%s)", c.BackoffMax, c.BackoffMin)
	case c.PollInterval < 0 || c.LeaseMargin < 0:
		return nil, errors.New("delivery: Config.PollInterval and LeaseMargin must be positive")
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = logrus.NewEntry(logrus.StandardLogger())
	}
	client := c.HTTPClient
	if client == nil {
		client = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	// A copy: the caller's client keeps its own redirect policy.
	noRedirect := *client
	noRedirect.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

	d := &Deliverer{
		pool: pool, cfg: c, client: &noRedirect,
		log:        c.Logger.WithField("component", "delivery"),
		channel:    outbox.DeliveryChannel(c.Schema),
		deadletter: deadletter.New(c.Schema),
		sql:        newStatements(c.Schema),
		tracer:     tracing.NewTracer(c.TracerProvider, tracerScope),
	}
	seen := map[string]bool{}
	for i, e := range c.Endpoints {
		field := fmt.Sprintf("delivery: Config.Endpoints[%d]", i)
		if e.Name == "" {
			return nil, fmt.Errorf("%s.Name is required", field)
		}
		field = fmt.Sprintf("delivery: endpoint %q", e.Name)
		if seen[e.Name] {
			return nil, fmt.Errorf("%s: Name is used twice", field)
		}
		seen[e.Name] = true
		u, err := url.Parse(e.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			// Not echoed: a capability URL is a secret.
			return nil, fmt.Errorf("%s: URL must be an absolute http or https URL", field)
		}
		key, err := ParseSecret(e.Secret)
		if err != nil {
			return nil, fmt.Errorf("%s: Secret: %w", field, err)
		}
		e.Timeout = cmp.Or(e.Timeout, TimeoutDefault)
		e.Concurrency = cmp.Or(e.Concurrency, ConcurrencyDefault)
		if e.Timeout < 0 || e.Concurrency < 0 {
			return nil, fmt.Errorf("%s: Timeout and Concurrency must be positive", field)
		}
		if e.Retry, err = e.Retry.withDefaults(&c); err != nil {
			return nil, fmt.Errorf("%s: %w", field, err)
		}
		if e.Rate < 0 || math.IsNaN(e.Rate) || math.IsInf(e.Rate, 0) {
			return nil, fmt.Errorf("%s: Rate must be a positive number of requests per second, or 0 for no cap", field)
		}
		if e.Breaker != nil {
			b, err := e.Breaker.withDefaults()
			if err != nil {
				return nil, fmt.Errorf("%s: %w", field, err)
			}
			e.Breaker = &b
		}
		d.endpoints = append(d.endpoints, &endpoint{Endpoint: e, key: key, redacted: redactURL(u), wake: make(chan struct{}, 1)})
	}
	return d, nil
}

func newStatements(schema string) statements {
	q := pgx.Identifier{schema}.Sanitize()
	t, e := q+".http_deliveries", q+".http_endpoints"
	gate, gateUpdate, breakerFail, breakerClose, breakerRelease := gateStatements(e)
	return statements{
		gate: gate, gateUpdate: gateUpdate,
		breakerFail: breakerFail, breakerClose: breakerClose, breakerRelease: breakerRelease,
		upsertEndpoint: `INSERT INTO ` + e + ` (name, url) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET url = excluded.url, updated_at = now() WHERE ` + e + `.url <> excluded.url`,
		status: `SELECT disabled_at IS NOT NULL, coalesce(disabled_reason, '') FROM ` + e + ` WHERE name = $1`,
		// The head rule: a keyed row is claimable only when no earlier row of its key is
		// still pending (in flight, waiting for a retry, or not yet tried). SKIP LOCKED lets
		// concurrent claimers pass each other; a row another claimer just leased fails the
		// lease condition on re-check.
		claim: `WITH claimable AS (
    SELECT d.id FROM ` + t + ` d
    WHERE d.endpoint = $1 AND d.state = 'pending' AND d.next_attempt_at <= now()
      AND (d.lease_until IS NULL OR d.lease_until < now())
      AND (d.key IS NULL OR NOT EXISTS (
          SELECT 1 FROM ` + t + ` p
          WHERE p.endpoint = d.endpoint AND p.key = d.key AND p.state = 'pending' AND p.id < d.id))
      AND NOT EXISTS (SELECT 1 FROM ` + e + ` x WHERE x.name = $1 AND x.disabled_at IS NOT NULL)
    ORDER BY d.id LIMIT $2
    FOR UPDATE OF d SKIP LOCKED)
UPDATE ` + t + ` d SET attempts = d.attempts + 1, lease_token = $3,
    lease_until = now() + $4::bigint * interval '1 microsecond'
FROM claimable c WHERE d.id = c.id
RETURNING d.id, d.operation_id, d.pipeline, d.causation_id, d.key, d.payload, d.headers, d.attempts, d.created_at`,
		nextDue: `SELECT extract(epoch FROM min(next_attempt_at) - now()) FROM ` + t + `
WHERE endpoint = $1 AND state = 'pending' AND next_attempt_at > now()`,
		backlog: `SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 FROM ` + t + `
WHERE endpoint = $1 AND state = 'pending'`,
		delivered: `UPDATE ` + t + ` SET state = 'delivered', finished_at = now(), lease_until = NULL,
    last_status = $3, last_error = NULL WHERE id = $1 AND lease_token = $2`,
		retry: `UPDATE ` + t + ` SET next_attempt_at = now() + $3::bigint * interval '1 microsecond',
    lease_until = NULL, last_status = $4, last_error = $5 WHERE id = $1 AND lease_token = $2`,
		dead: `UPDATE ` + t + ` SET state = 'dead', finished_at = now(), lease_until = NULL,
    last_status = $3, last_error = $4 WHERE id = $1 AND lease_token = $2`,
		// A 410 does not count against the event: it waits for the endpoint to come back.
		release: `UPDATE ` + t + ` SET lease_until = NULL, attempts = greatest(attempts - 1, 0),
    last_status = $3, last_error = $4 WHERE id = $1 AND lease_token = $2`,
		disable: `INSERT INTO ` + e + ` (name, url, disabled_at, disabled_reason) VALUES ($1, $2, now(), $3)
ON CONFLICT (name) DO UPDATE SET disabled_at = now(), disabled_reason = excluded.disabled_reason, updated_at = now()`,
	}
}

// Run delivers until ctx ends, then waits for the requests in flight (each bounded by its
// endpoint's Timeout) and records their outcome. It returns nil when ctx ended.
func (d *Deliverer) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, ep := range d.endpoints {
		wg.Go(func() { d.runEndpoint(ctx, ep) })
	}
	wg.Go(func() { d.listen(ctx) })
	wg.Wait()
	return nil
}

// listen wakes every endpoint loop on each NOTIFY of the delivery channel. Without it the
// loops still poll; so it reconnects quietly after a PollInterval when its connection dies.
func (d *Deliverer) listen(ctx context.Context) {
	for ctx.Err() == nil {
		err := d.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		d.log.WithError(err).Warn("delivery wake-up listener failed; polling until it reconnects")
		select {
		case <-ctx.Done():
			return
		case <-time.After(d.cfg.PollInterval):
		}
	}
}

func (d *Deliverer) listenOnce(ctx context.Context) error {
	conn, err := pgx.ConnectConfig(ctx, d.pool.Config().ConnConfig.Copy())
	if err != nil {
		return fmt.Errorf("error connecting the delivery listener: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{d.channel}.Sanitize()); err != nil {
		return fmt.Errorf("error listening on %s: %w", d.channel, err)
	}
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return fmt.Errorf("error waiting for notifications: %w", err)
		}
		for _, ep := range d.endpoints {
			ep.signal()
		}
	}
}

func (ep *endpoint) signal() {
	select {
	case ep.wake <- struct{}{}:
	default:
	}
}

// row is one claimed delivery.
type row struct {
	id          int64
	op          uuid.UUID
	pipeline    string
	causation   string
	key         []byte
	payload     []byte
	headers     map[string]string
	attempts    int
	createdAt   time.Time
	leaseToken  uuid.UUID
	leaseExpiry time.Time
}

// runEndpoint claims due rows of one endpoint while it has free slots, and sleeps until a
// request finishes, a NOTIFY arrives, the next retry is due, or PollInterval passed.
func (d *Deliverer) runEndpoint(ctx context.Context, ep *endpoint) {
	log := d.log.WithField("endpoint", ep.Name)
	var wg sync.WaitGroup
	defer wg.Wait()
	done := make(chan struct{}, ep.Concurrency) // never blocks a finishing request
	inflight, failures := 0, 0
	registered, wasDisabled := false, false
	endpointDisabled.WithLabelValues(ep.Name).Set(0)
	var lastStats time.Time
	for ctx.Err() == nil {
		wait := d.cfg.PollInterval
		err := func() error {
			if !registered {
				if _, err := d.pool.Exec(ctx, d.sql.upsertEndpoint, ep.Name, ep.redacted); err != nil {
					return fmt.Errorf("error registering endpoint: %w", err)
				}
				registered = true
			}
			if time.Since(lastStats) >= d.cfg.StatsInterval {
				var n int64
				var age float64
				if err := d.pool.QueryRow(ctx, d.sql.backlog, ep.Name).Scan(&n, &age); err != nil {
					return fmt.Errorf("error reading the delivery backlog: %w", err)
				}
				backlog.WithLabelValues(ep.Name).Set(float64(n))
				oldestPending.WithLabelValues(ep.Name).Set(age)
				lastStats = time.Now()
			}
			var (
				disabled bool
				reason   string
			)
			if err := d.pool.QueryRow(ctx, d.sql.status, ep.Name).Scan(&disabled, &reason); err != nil {
				return fmt.Errorf("error reading endpoint status: %w", err)
			}
			if disabled != wasDisabled {
				wasDisabled = disabled
				if disabled {
					endpointDisabled.WithLabelValues(ep.Name).Set(1)
					log.WithField("reason", reason).WithField("re_enable", reEnable(ep.Name)).Error("endpoint is disabled; its events stay queued until an operator re-enables it")
				} else {
					endpointDisabled.WithLabelValues(ep.Name).Set(0)
					log.Info("endpoint is enabled; delivering its queued events")
				}
				d.signals.EndpointState.Signal(endpointState{Endpoint: ep.Name, Disabled: disabled})
			}
			if disabled {
				return nil
			}
			if free := ep.Concurrency - inflight; free > 0 {
				var rows []*row
				var err error
				if ep.Rate > 0 || ep.Breaker != nil {
					var gateWait time.Duration
					rows, gateWait, err = d.claimGated(ctx, ep, free)
					if gateWait > 0 {
						wait = min(wait, gateWait+time.Millisecond)
					}
				} else {
					rows, err = d.claim(ctx, ep, free)
				}
				if err != nil {
					return err
				}
				for _, r := range rows {
					inflight++
					wg.Go(func() {
						d.attempt(ctx, ep, r)
						done <- struct{}{}
					})
				}
			}
			if inflight < ep.Concurrency {
				var secs *float64
				if err := d.pool.QueryRow(ctx, d.sql.nextDue, ep.Name).Scan(&secs); err != nil {
					return fmt.Errorf("error reading the next retry time: %w", err)
				}
				if secs != nil {
					wait = min(wait, time.Duration(*secs*float64(time.Second))+time.Millisecond)
				}
			}
			return nil
		}()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			failures++
			wait = retry.Backoff(100*time.Millisecond, 10*time.Second, failures)
			log.WithError(err).WithField("retry_in", wait.Seconds()).Warn("error reading deliveries; retrying")
		default:
			failures = 0
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-done:
			inflight--
		case <-ep.wake:
		case <-timer.C:
		}
		timer.Stop()
	}
}

func (d *Deliverer) claim(ctx context.Context, ep *endpoint, limit int) ([]*row, error) {
	token := uuid.New()
	lease := ep.Timeout + d.cfg.LeaseMargin
	rows, err := d.pool.Query(ctx, d.sql.claim, ep.Name, limit, token, lease.Microseconds())
	if err != nil {
		return nil, fmt.Errorf("error claiming deliveries: %w", err)
	}
	return collectClaimed(rows, token, lease)
}

// collectClaimed reads the rows a claim statement returned.
func collectClaimed(rows pgx.Rows, token uuid.UUID, lease time.Duration) ([]*row, error) {
	out, err := pgx.CollectRows(rows, func(cr pgx.CollectableRow) (*row, error) {
		r := &row{leaseToken: token, leaseExpiry: time.Now().Add(lease)}
		err := cr.Scan(&r.id, &r.op, &r.pipeline, &r.causation, &r.key, &r.payload, &r.headers, &r.attempts, &r.createdAt)
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("error claiming deliveries: %w", err)
	}
	return out, nil
}

// attempt sends one request and records its outcome. It runs on after ctx ends: the
// request is bounded by the endpoint's Timeout, and an answer that came must be recorded.
func (d *Deliverer) attempt(ctx context.Context, ep *endpoint, r *row) {
	ctx = context.WithoutCancel(ctx)
	log := d.log.WithFields(logrus.Fields{
		"endpoint": ep.Name, "pipeline": r.pipeline, "message_id": r.causation, "operation_id": r.op.String(), "attempt": r.attempts,
	})
	start := time.Now()
	sctx, span := d.startAttempt(ctx, ep, r)
	status, retryAfter, detail, err := d.post(sctx, ep, r)
	endAttempt(span, status, err)
	attemptDuration.WithLabelValues(ep.Name).Observe(time.Since(start).Seconds())

	a := Attempt{DeliveryID: r.id, Endpoint: ep.Name, OperationID: r.op, Number: r.attempts, Status: status, Err: err}
	lastErr := detail
	if err != nil {
		lastErr = err.Error()
	}
	switch {
	case err == nil && status >= 200 && status <= 299:
		a.Outcome = Delivered
	case err == nil && status == http.StatusGone:
		a.Outcome = Disabled
	case errors.As(err, new(*buildError)):
		// Nothing was sent, and nothing ever will be: retrying would only hold back the
		// key's later events for MaxAge.
		a.Outcome = DeadLettered
		lastErr = "refused before sending: " + lastErr
	case err != nil || retry.Retryable(status):
		policy := ep.Retry
		a.Outcome = Retry
		a.RetryIn = max(retry.Backoff(policy.MinBackoff, policy.MaxBackoff, r.attempts), retryAfter)
		switch {
		case r.attempts >= policy.MaxAttempts:
			a.Outcome = DeadLettered
			lastErr = fmt.Sprintf("retries exhausted after %d attempts; last: %s", r.attempts, lastErr)
		case time.Since(r.createdAt)+a.RetryIn > policy.MaxAge:
			a.Outcome = DeadLettered
			lastErr = fmt.Sprintf("retries exhausted: next attempt would start more than %s after the event; last: %s", policy.MaxAge, lastErr)
		}
	default:
		a.Outcome = DeadLettered
		lastErr = "refused: " + lastErr
	}
	lastErr = cleanText(lastErr, 1000)

	verdict := verdictAnswered
	switch {
	case errors.As(err, new(*buildError)):
		verdict = verdictNone
	case err != nil || retry.Retryable(status):
		verdict = verdictFailed
	}
	d.recordBreaker(ctx, ep, verdict, log)
	if recErr := d.record(ctx, ep, r, a, lastErr); recErr != nil {
		// The lease runs out and another attempt follows, with the same key.
		log.WithError(recErr).Warn("error recording a delivery attempt; it will be retried after its lease")
		return
	}
	attemptsTotal.WithLabelValues(ep.Name, string(a.Outcome)).Inc()
	switch a.Outcome {
	case Delivered:
		log.WithField("status", status).Debug("delivered")
	case Retry:
		log.WithField("status", status).WithField("retry_in", a.RetryIn.Seconds()).WithField("error", lastErr).Debug("delivery failed; retrying")
	case DeadLettered:
		log.WithField("status", status).WithField("reason", lastErr).Warn("delivery dead-lettered")
	case Disabled:
		log.WithField("status", status).WithField("re_enable", reEnable(ep.Name)).Error("endpoint answered 410 Gone: disabled; its events stay queued until an operator re-enables it")
		ep.signal() // the loop logs the transition and stops claiming
	}
	if d.cfg.AfterAttempt != nil {
		d.cfg.AfterAttempt(a)
	}
}

// reEnable tells an operator how to re-enable endpoint name: idemd's admin API and console
// (library users call Store.Enable).
func reEnable(name string) string {
	return "POST /api/v1/endpoints/" + url.PathEscape(name) + "/enable on the admin address, or Enable on the console's Deliveries page (/ui/deliveries)"
}

// post sends one attempt. It returns the status and Retry-After of an answer, a short
// description of it, or the error of a request that got no answer.
func (d *Deliverer) post(ctx context.Context, ep *endpoint, r *row) (status int, retryAfter time.Duration, detail string, err error) {
	ctx, cancel := context.WithTimeout(ctx, ep.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ep.URL, bytes.NewReader(r.payload))
	if err != nil {
		return 0, 0, "", &buildError{ep.redact(err)}
	}
	op := r.op.String()
	ts := d.cfg.Now().Unix()
	h := req.Header
	h.Set("Content-Type", contentType(r))
	h.Set("User-Agent", "idemd")
	h.Set(HeaderIdempotencyKey, op)
	h.Set(HeaderWebhookID, op)
	h.Set(HeaderWebhookTimestamp, strconv.FormatInt(ts, 10))
	h.Set(HeaderWebhookSignature, Sign(ep.key, op, ts, r.payload))
	h.Set(outbox.HeaderCausationID, r.causation)
	h.Set(outbox.HeaderPipeline, r.pipeline)
	if et := r.headers[outbox.HeaderEventType]; et != "" {
		h.Set(outbox.HeaderEventType, et)
	}
	tracing.SetHTTP(h, traceRequest(ctx, r))
	for name, values := range h {
		for _, v := range values {
			if !httpguts.ValidHeaderFieldValue(v) {
				// Go's client would refuse it too, before sending, on every attempt.
				return 0, 0, "", &buildError{fmt.Errorf("header %s holds a character HTTP does not allow (CR, LF or another control character)", name)}
			}
		}
	}
	resp, err := d.client.Do(req)
	if err != nil {
		err = ep.redact(err)
		if errors.Is(err, context.DeadlineExceeded) {
			return 0, 0, "", fmt.Errorf("no answer within %s: %w", ep.Timeout, err)
		}
		return 0, 0, "", err
	}
	defer resp.Body.Close()
	// A bounded read: the snippet goes into last_error, and draining lets the connection be
	// reused.
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	detail = resp.Status
	if s := strings.TrimSpace(string(snippet)); s != "" {
		detail += ": " + s
	}
	retryAfter, _ = retry.RetryAfter(resp.Header.Get("Retry-After"), time.Now())
	return resp.StatusCode, retryAfter, detail, nil
}

// buildError is an attempt that failed before anything was sent because the request cannot
// be built from its row; no retry can change that.
type buildError struct{ err error }

func (e *buildError) Error() string { return "error building the request: " + e.err.Error() }
func (e *buildError) Unwrap() error { return e.err }

// redact replaces the full URL that net/http's errors quote ("Post \"https://…\": …") by
// the redacted one. The rest of such an error names hosts and addresses only.
func (ep *endpoint) redact(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		ue.URL = ep.redacted
	}
	return err
}

func contentType(r *row) string {
	if ct := r.headers[outbox.HeaderContentType]; ct != "" {
		return ct
	}
	if json.Valid(r.payload) {
		return "application/json"
	}
	return "application/octet-stream"
}

// record writes the outcome of an attempt, only if this attempt still holds the row's
// lease (else a later attempt owns the row and will record its own).
func (d *Deliverer) record(ctx context.Context, ep *endpoint, r *row, a Attempt, lastErr string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var status *int
	if a.Status != 0 {
		status = &a.Status
	}
	switch a.Outcome {
	case Delivered:
		return d.exec(ctx, d.sql.delivered, r.id, r.leaseToken, status)
	case Retry:
		return d.exec(ctx, d.sql.retry, r.id, r.leaseToken, a.RetryIn.Microseconds(), status, lastErr)
	}
	return pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		switch a.Outcome {
		case Disabled:
			if _, err := tx.Exec(ctx, d.sql.disable, ep.Name, ep.redacted, cleanText(fmt.Sprintf("%s answered %s", ep.redacted, lastErr), 1000)); err != nil {
				return fmt.Errorf("error disabling endpoint: %w", err)
			}
			return d.execTx(ctx, tx, d.sql.release, r.id, r.leaseToken, status, lastErr)
		default: // DeadLettered: the row and its dead letter commit together
			if err := d.execTx(ctx, tx, d.sql.dead, r.id, r.leaseToken, status, lastErr); err != nil {
				return err
			}
			_, err := d.deadletter.WriteTx(ctx, tx, &deadletter.Letter{
				Pipeline:  r.pipeline,
				Origin:    deadletter.Origin{Door: deadletter.DoorDelivery, DeliveryID: r.id, OperationID: r.op},
				Scope:     "http:" + ep.Name,
				MessageID: r.op.String(),
				Payload:   r.payload,
				Headers:   letterHeaders(r.headers),
				Metadata: map[string]any{
					"door": "http_delivery", "endpoint": ep.Name, "url": ep.redacted, "delivery_id": r.id,
					"operation_id": r.op.String(), "causation_id": r.causation, "key": string(r.key), "status": a.Status,
				},
				Reason:   lastErr,
				Attempts: r.attempts,
			})
			return err
		}
	})
}

var errLeaseLost = errors.New("the row's lease passed to another attempt")

func (d *Deliverer) exec(ctx context.Context, sql string, args ...any) error {
	tag, err := d.pool.Exec(ctx, sql, args...)
	if err != nil {
		return fmt.Errorf("error recording delivery: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return errLeaseLost
	}
	return nil
}

func (d *Deliverer) execTx(ctx context.Context, tx pgx.Tx, sql string, args ...any) error {
	tag, err := tx.Exec(ctx, sql, args...)
	if err != nil {
		return fmt.Errorf("error recording delivery: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return errLeaseLost
	}
	return nil
}

func letterHeaders(h map[string]string) map[string][]string {
	out := make(map[string][]string, len(h))
	for k, v := range h {
		out[k] = []string{v}
	}
	return out
}

// cleanText makes an endpoint's answer storable as PostgreSQL text: valid UTF-8, no NUL,
// bounded.
func cleanText(s string, limit int) string {
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "?"), "\x00", "")
	if len(s) <= limit {
		return s
	}
	for limit > 0 && !utf8.RuneStart(s[limit]) {
		limit--
	}
	return s[:limit] + "…"
}

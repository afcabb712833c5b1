// Package receiver is idemd's HTTP door: verified webhooks and API requests with the
// Idempotency-Key contract, applied exactly once. Guarantee: a request's effect, its outbox
// event and its processed record (or its dead letter) commit in one PostgreSQL transaction,
// through the unit of work (package exactlyonce), and the response is written only after
// that commit; a retried request never repeats the effect, it gets the recorded answer.
//
// Concurrent webhook requests share transactions (group commit): a small batcher hands what
// is waiting, up to Config.MaxBatch, to one exactlyonce.Apply call, and each request is
// answered after the shared commit. API requests reserve their key in a short committed
// transaction first, so that a concurrent retry sees it in flight (409) instead of waiting.
//
// A Receiver is an http.Handler: mount it where its sources' paths are served.
package receiver

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sirupsen/logrus"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemd/idemd/exactlyonce"
	"github.com/idemd/idemd/internal/fingerprint"
	"github.com/idemd/idemd/internal/jsonpointer"
	"github.com/idemd/idemd/internal/metrics"
	"github.com/idemd/idemd/internal/pgerr"
	"github.com/idemd/idemd/internal/tracing"
	"github.com/idemd/idemd/migrations"
	"github.com/idemd/idemd/processed"
)

// Receiver serves the configured sources. Build it with New; Close it when done.
type Receiver struct {
	pool      *pgxpool.Pool
	cfg       Config
	unit      *exactlyonce.Unit
	processed *processed.Store
	log       *logrus.Entry
	tracer    *tracing.Tracer

	byPath map[string]*source
	byName map[string]*source
	// logs is each source's entry (pipeline field), made once: a WithField per request
	// copies the entry's fields even when nothing is logged.
	logs map[*source]*logrus.Entry

	queue chan *item
	sem   chan struct{}
	// flying holds the keys of the webhooks handed to the batcher and not yet answered: a
	// retry of one waits for it outside the batches (inFlight).
	flying inFlight
	// txMean is a moving average of the batches' transaction durations, in nanoseconds
	// (0 until the first): a batch lingers half of it, at most Linger (lingerNow).
	txMean     atomic.Int64
	unverified unverifiedBudget
	ctx        context.Context
	cancel     context.CancelFunc
	wg         sync.WaitGroup
	closeOnce  sync.Once
}

// item is one webhook request waiting for its batch.
type item struct {
	msg  *exactlyonce.Message
	err  error
	done chan struct{}
	// giveUp is when the request stops waiting for a worker (its arrival plus
	// ApplyTimeout): it is then answered 503 with nothing stored.
	giveUp time.Time
}

// New checks cfg (every effect SQL must prepare on pool), fills its defaults and starts the
// batcher. Errors name the source and the field.
func New(pool *pgxpool.Pool, cfg *Config) (*Receiver, error) {
	if pool == nil {
		return nil, errors.New("receiver: pool is required")
	}
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	c.Schema = cmp.Or(c.Schema, migrations.SchemaDefault)
	c.MaxBatch = cmp.Or(c.MaxBatch, MaxBatchDefault)
	c.Linger = cmp.Or(c.Linger, LingerDefault)
	c.Workers = cmp.Or(c.Workers, int(pool.Config().MaxConns), 1)
	c.ApplyTimeout = cmp.Or(c.ApplyTimeout, ApplyTimeoutDefault)
	c.Lease = cmp.Or(c.Lease, LeaseDefault)
	c.MaxWait = cmp.Or(c.MaxWait, MaxWaitDefault)
	c.MaxUnverifiedBytes = cmp.Or(c.MaxUnverifiedBytes, MaxUnverifiedBytesDefault)
	if c.Logger == nil {
		c.Logger = logrus.NewEntry(logrus.StandardLogger())
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	switch {
	case len(c.Sources) == 0:
		return nil, errors.New("receiver: Sources: at least one source is required")
	case c.MaxBatch < 1:
		return nil, fmt.Errorf("receiver: MaxBatch must be at least 1, got %d", c.MaxBatch)
	case c.Workers < 1:
		return nil, fmt.Errorf("receiver: Workers must be at least 1, got %d", c.Workers)
	case c.ApplyTimeout < 0, c.Lease < 0, c.MaxWait < 0, c.MaxUnverifiedBytes < 0:
		return nil, errors.New("receiver: ApplyTimeout, Lease, MaxWait and MaxUnverifiedBytes must not be negative")
	}
	store, err := processed.New(&processed.Config{Schema: c.Schema, Lease: c.Lease, Filter: c.Filter})
	if err != nil {
		return nil, fmt.Errorf("receiver: %w", err)
	}
	r := &Receiver{
		pool:      pool,
		cfg:       c,
		processed: store,
		log:       c.Logger.WithField("component", "receiver"),
		byPath:    map[string]*source{},
		byName:    map[string]*source{},
		logs:      map[*source]*logrus.Entry{},
		queue:     make(chan *item),
		sem:       make(chan struct{}, c.Workers),
		tracer:    tracing.NewTracer(c.TracerProvider, tracerScope),
	}
	r.unverified.max = c.MaxUnverifiedBytes
	ecfg := &exactlyonce.Config{
		Schema:    c.Schema,
		Processed: store,
		Logger:    r.log,
		OnRetry:   func(error) { metrics.Retries.WithLabelValues("http").Inc() },
		// A sender waits for the answer (Shopify gives up after 5 s, Slack resends after
		// 3 s): while the database cannot be reached, 503 at once, and its retry is ours.
		GiveUpUnreachable: true,
		// The unit's spans continue each request's (its message's Trace).
		TracerProvider: c.TracerProvider,
		Handoff:        c.Handoff,
	}
	if hook := c.BeforeCommit; hook != nil {
		ecfg.BeforeCommit = func(msgs []*exactlyonce.Message) {
			ids := make([]string, len(msgs))
			for i, m := range msgs {
				ids[i] = m.ID
			}
			hook(ids)
		}
	}
	if r.unit, err = exactlyonce.New(pool, ecfg); err != nil {
		return nil, fmt.Errorf("receiver: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, s := range c.Sources {
		src, err := compileSource(ctx, pool, s)
		if err != nil {
			return nil, fmt.Errorf("receiver: source %d (%q): %w", i, s.Name, err)
		}
		if r.byName[src.name] != nil {
			return nil, fmt.Errorf("receiver: source %d (%q): name: used twice", i, s.Name)
		}
		if r.byPath[src.path] != nil {
			return nil, fmt.Errorf("receiver: source %d (%q): path %q: used twice", i, s.Name, src.path)
		}
		r.byName[src.name], r.byPath[src.path] = src, src
		r.logs[src] = r.log.WithField("pipeline", src.name)
		metrics.Pipeline(src.name, "http")
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.wg.Add(1)
	go r.batchLoop()
	return r, nil
}

// Close stops taking webhook requests and waits for the transactions in progress. Safe to
// call twice.
func (r *Receiver) Close() {
	r.closeOnce.Do(func() {
		r.cancel()
		r.wg.Wait()
	})
}

var errClosed = errors.New("receiver is closed")

// errNoWorker is the answer of a webhook request that waited ApplyTimeout for a worker
// while every worker's batch was in its transaction: nothing of it was stored.
var errNoWorker = errors.New("no worker was free within the apply timeout: every worker's batch was in its transaction")

// errFirstInFlight is the answer of a webhook whose id (or signed body) was still in flight
// here, in an earlier delivery's transaction, ApplyTimeout after it arrived.
var errFirstInFlight = errors.New("an earlier delivery of this id was still in its transaction after the apply timeout")

// ServeHTTP routes a request to its source: POST {path}, and for API sources PUT
// {path}/{key}, GET {path}/{key} (Idempotency.Lookup) and DELETE {path}/{id} (Delete).
func (r *Receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	start := time.Now()
	req, span := r.startRequest(req)
	sw := &statusWriter{ResponseWriter: w}
	src, act, key, ok := r.route(sw, req)
	pipeline := "unknown"
	if src != nil {
		pipeline = src.name
	}
	if ok {
		r.serve(sw, req, src, act, key)
	}
	metrics.RequestDuration.WithLabelValues(pipeline, strconv.Itoa(sw.code())).Observe(time.Since(start).Seconds())
	endRequest(span, req, src, sw.code())
}

// route finds the source and the action; it answers 404 or 405 itself (ok false).
func (r *Receiver) route(w http.ResponseWriter, req *http.Request) (*source, action, string, bool) {
	p := req.URL.Path
	if src := r.byPath[p]; src != nil {
		if req.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			r.reject(w, src, probMethod, "use POST", "method")
			return src, 0, "", false
		}
		return src, actApply, "", true
	}
	if src, key := r.item(req.URL); src != nil {
		act, ok := src.itemAction(req.Method)
		if !ok {
			allow := src.itemMethods()
			w.Header().Set("Allow", allow)
			r.reject(w, src, probMethod, "use "+allow, "method")
			return src, 0, "", false
		}
		return src, act, key, true
	}
	metrics.Rejected.WithLabelValues("unknown", "not_found").Inc()
	writeProblem(w, probNotFound, "", "", 0)
	return nil, 0, "", false
}

// item splits an item URL, {path}/{key}, of an API source: the key is the last segment of
// the path as sent, unescaped, so that a key holding a '/' (sent as %2F) is found too.
func (r *Receiver) item(u *url.URL) (*source, string) {
	ep := u.EscapedPath()
	i := strings.LastIndexByte(ep, '/')
	if i <= 0 {
		return nil, ""
	}
	p, err := url.PathUnescape(ep[:i])
	if err != nil {
		return nil, ""
	}
	key, err := url.PathUnescape(ep[i+1:])
	if src := r.byPath[p]; src != nil && src.api && err == nil && key != "" {
		return src, key
	}
	return nil, ""
}

func (r *Receiver) reject(w http.ResponseWriter, src *source, p problem, detail, reason string) {
	metrics.Rejected.WithLabelValues(src.name, reason).Inc()
	writeProblem(w, p, detail, "", 0)
}

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request, src *source, act action, urlKey string) {
	if act != actLookup {
		metrics.Received.WithLabelValues(src.name, "http").Inc()
	}
	log := r.logs[src]
	if req.ContentLength > src.bodyLimit {
		r.reject(w, src, probTooLarge, fmt.Sprintf("the limit is %d bytes", src.bodyLimit), "too_large")
		return
	}
	release, ok := r.admit(w, req, src) // MaxUnverifiedBytes
	if !ok {
		return
	}
	defer release()
	// Counted while reading: a chunked body has no Content-Length to trust.
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, src.bodyLimit))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			r.reject(w, src, probTooLarge, fmt.Sprintf("the limit is %d bytes", src.bodyLimit), "too_large")
			return
		}
		r.reject(w, src, probBadBody, "", "bad_body")
		return
	}
	tenant, err := src.verifier.verify(req.Header, body, r.cfg.Now())
	release() // verified or refused: the body no longer counts as unverified
	if err != nil {
		// The reason goes to the log only: the response must not teach a prober anything.
		log.WithField("reason", err.Error()).Warn("request failed verification")
		if src.scheme == SchemeBearer {
			w.Header().Set("WWW-Authenticate", "Bearer")
			r.reject(w, src, probUnauthorized, "", "unauthorized")
			return
		}
		r.reject(w, src, probSignature, "", "signature")
		return
	}
	rq := &Request{
		Source: src.name, Tenant: tenant, Method: req.Method, Path: req.URL.Path,
		Header: src.cleanHeaders(req.Header), Body: body, ReceivedAt: time.Now(),
	}
	c := &call{src: src, req: rq, body: &parsedBody{raw: body}, scope: processed.Scope(src.name, tenant),
		trace: requestTrace(req), span: trace.SpanFromContext(req.Context())}
	if !src.api && act == actApply {
		// A webhook's fingerprint, verified body and all, before its fields are read: its
		// canonical form says the body is valid JSON, which the reads need to know.
		var canonical bool
		c.fp, canonical = fingerprint.BodyCanonical(body, src.ignore...)
		c.body.checkedBy(canonical)
	}
	c.eventType = src.eventType(req.Header, c.body)
	switch {
	case act == actLookup:
		r.serveLookup(w, req, c, urlKey, log)
	case act == actDelete:
		r.serveDelete(w, req, c, urlKey, log)
	case src.api:
		r.serveAPI(w, req, c, urlKey, log)
	default:
		r.serveWebhook(w, c, log)
	}
}

func (r *Receiver) serveWebhook(w http.ResponseWriter, c *call, log *logrus.Entry) {
	src := c.src
	if src.scheme == SchemeSlack && c.eventType == "" {
		if challenge, ok := slackChallenge(c.body); ok {
			// Slack's Events API sends this, signed, when the endpoint is set up, and
			// enables the endpoint only once it is echoed. It is no event: nothing is
			// recorded or applied.
			log.Info("answered Slack's url_verification challenge")
			b, _ := json.Marshal(struct {
				Challenge string `json:"challenge"`
			}{challenge})
			writeJSON(w, http.StatusOK, b, false)
			return
		}
	}
	id, err := lookup(src.msgID, http.Header(c.req.Header), c.body)
	if err != nil {
		r.reject(w, src, probMissingID, err.Error(), "bad_message_id")
		return
	}
	c.req.MessageID = id
	if log.Logger.IsLevelEnabled(logrus.DebugLevel) {
		log.WithField("message_id", id).WithField("payload", string(c.req.Body)).Debug("webhook verified")
	}

	m := src.message(c)
	err = r.submit(m)
	noteMessage(c.span, m)
	if err != nil || (m.Outcome != exactlyonce.Applied && m.Outcome != exactlyonce.Duplicate) {
		log = log.WithField("message_id", id) // only what is logged pays for the field
	}
	switch {
	case errors.Is(err, errFirstInFlight):
		metrics.Rejected.WithLabelValues(src.name, "in_flight").Inc()
		log.Warn("an earlier delivery of this id was still in its transaction after the apply timeout; answered 503, nothing stored")
		writeProblem(w, probUnavailable, "an earlier delivery of this message id is still being applied: retry later", id, 1)
	case errors.Is(err, errNoWorker):
		metrics.Rejected.WithLabelValues(src.name, "no_worker").Inc()
		log.Warn("no worker was free within the apply timeout (every worker's batch in its transaction); answered 503, nothing stored")
		writeProblem(w, probUnavailable, "the receiver is busy: retry later", id, 1)
	case err != nil:
		src.failures.error(log, err, "webhook transaction failed; answered 503, nothing stored")
		writeProblem(w, probUnavailable, "retry later", id, 1)
	case m.Outcome == exactlyonce.Applied:
		metrics.Processed.WithLabelValues(src.name).Inc()
		writeJSON(w, http.StatusOK, statusBody("processed", id), false)
	case m.Outcome == exactlyonce.Duplicate:
		metrics.Duplicates.WithLabelValues(src.name).Inc()
		writeJSON(w, http.StatusOK, statusBody("duplicate", id), true)
	case m.Outcome == exactlyonce.Conflict:
		metrics.Conflicts.WithLabelValues(src.name).Inc()
		log.WithField("conflict_count", m.ConflictCount).Warn("message id reused with a different payload; recorded")
		writeProblem(w, probConflict, "this message id was received before with a different payload", id, 0)
	case m.Outcome == exactlyonce.DeadLettered:
		metrics.DeadLettered.WithLabelValues(src.name).Inc()
		log.WithField("reason", pgerr.ForLog(m.Cause, log.Logger.IsLevelEnabled(logrus.DebugLevel))).
			Warn("webhook effect failed permanently; dead-lettered (the error is whole in the dead letter)")
		writeJSON(w, http.StatusAccepted, statusBody("dead_lettered", id), false)
	default: // Stale
		metrics.Stale.WithLabelValues(src.name).Inc()
		writeJSON(w, http.StatusOK, statusBody("stale", id), false)
	}
}

// submit hands m to the batcher and waits for its commit. It waits for a worker up to
// ApplyTimeout (errNoWorker after), so that a database slower than the arrivals makes
// senders retry later instead of piling up requests, each holding its body, behind the
// workers.
func (r *Receiver) submit(m *exactlyonce.Message) error {
	it := &item{msg: m, done: make(chan struct{}), giveUp: time.Now().Add(r.cfg.ApplyTimeout)}
	// A retry of a webhook still in flight here waits for it, up to the same ApplyTimeout,
	// rather than hold up a batch (inFlight).
	for first := r.flying.enter(it, m); first != nil; first = r.flying.enter(it, m) {
		if err := r.waitFor(first, it.giveUp); err != nil {
			return err
		}
	}
	defer r.flying.leave(it, m)
	select {
	case r.queue <- it: // the batcher was waiting for requests: the common case, no timer
	default:
		t := time.NewTimer(time.Until(it.giveUp))
		select {
		case r.queue <- it:
			t.Stop()
		case <-t.C:
			it.answer(errNoWorker) // never handed to the batcher: its retries need not wait
			return errNoWorker
		case <-r.ctx.Done():
			t.Stop()
			it.answer(errClosed)
			return errClosed
		}
	}
	// Not abandoned on client disconnect: the batch commits anyway, and leaving would only
	// lose the answer.
	<-it.done
	return it.err
}

// waitFor waits until first is answered, or until giveUp (errFirstInFlight: answered 503
// with Retry-After, nothing stored).
func (r *Receiver) waitFor(first *item, giveUp time.Time) error {
	select {
	case <-first.done:
		return nil
	default:
	}
	t := time.NewTimer(time.Until(giveUp))
	defer t.Stop()
	select {
	case <-first.done:
		return nil
	case <-t.C:
		return errFirstInFlight
	case <-r.ctx.Done():
		return errClosed
	}
}

// answer ends it without a transaction.
func (it *item) answer(err error) {
	it.err = err
	close(it.done)
}

// acquire waits for a worker for first, up to its giveUp; false when first was answered
// instead (no worker in time, or the receiver closing).
func (r *Receiver) acquire(first *item) bool {
	select {
	case r.sem <- struct{}{}:
		return true
	default:
	}
	t := time.NewTimer(time.Until(first.giveUp))
	defer t.Stop()
	select {
	case r.sem <- struct{}{}:
		return true
	case <-t.C:
		first.answer(errNoWorker)
	case <-r.ctx.Done():
		first.answer(errClosed)
	}
	return false
}

// batchLoop collects waiting requests into batches: it takes the first, waits for a worker
// (up to the first's ApplyTimeout), then takes whatever else is already waiting, up to
// MaxBatch. While other batches are committing it lingers up to Linger for more; an idle
// receiver sends at once.
func (r *Receiver) batchLoop() {
	defer r.wg.Done()
	var timer *time.Timer
	for {
		var first *item
		select {
		case first = <-r.queue:
		case <-r.ctx.Done():
			return
		}
		if !r.acquire(first) {
			continue
		}
		batch := []*item{first}
		busy := len(r.sem) > 1
		lingering := false
	drain:
		for len(batch) < r.cfg.MaxBatch {
			select {
			case it := <-r.queue:
				batch = append(batch, it)
				continue
			default:
			}
			if !busy || r.cfg.Linger <= 0 {
				break
			}
			if !lingering {
				// One wait from the first, not from each arrival: under a steady stream a
				// wait renewed by every request would hold the batch until MaxBatch, or
				// until the clients have nothing left to send.
				lingering = true
				if timer == nil {
					timer = time.NewTimer(r.lingerNow())
				} else {
					timer.Reset(r.lingerNow())
				}
			}
			select {
			case it := <-r.queue:
				batch = append(batch, it)
			case <-timer.C:
				break drain
			}
		}
		if lingering {
			timer.Stop()
		}
		r.wg.Add(1)
		go r.applyBatch(batch)
	}
}

// txMeanWeight is the weight of the batches before in txMean: each new duration counts for
// 1/txMeanWeight of the average, so that it follows the last few dozen transactions.
const txMeanWeight = 16

// observeTx adds a batch's transaction duration d to txMean.
func (r *Receiver) observeTx(d time.Duration) {
	for {
		old := r.txMean.Load()
		next := int64(d)
		if old > 0 {
			next = old + (int64(d)-old)/txMeanWeight
		}
		if r.txMean.CompareAndSwap(old, next) {
			return
		}
	}
}

// lingerNow is how long the batch being collected waits for more requests: half the
// recent transactions' mean duration, at most Linger (Linger itself before the first
// transaction). A batch sent by then is ready when about half of the one in flight is
// done; waiting longer than a whole transaction only delays its requests.
func (r *Receiver) lingerNow() time.Duration {
	if mean := time.Duration(r.txMean.Load()); mean > 0 {
		return min(r.cfg.Linger, mean/2)
	}
	return r.cfg.Linger
}

func (r *Receiver) applyBatch(batch []*item) {
	defer r.wg.Done()
	defer func() { <-r.sem }()
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.ApplyTimeout)
	defer cancel()
	msgs := make([]*exactlyonce.Message, len(batch))
	for i, it := range batch {
		msgs[i] = it.msg
	}
	start := time.Now()
	err := r.unit.Apply(ctx, msgs)
	took := time.Since(start)
	r.observeTx(took)
	metrics.TxDuration.WithLabelValues("http").Observe(took.Seconds())
	metrics.TxBatchSize.WithLabelValues("http").Observe(float64(len(msgs)))
	for _, it := range batch {
		it.answer(err)
	}
}

// statusWriter remembers the status for the latency metric.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusWriter) code() int { return cmp.Or(s.status, http.StatusOK) }

// Unwrap lets http.ResponseController reach the connection.
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// slackChallenge returns the challenge of a Slack url_verification request:
// {"type":"url_verification","challenge":"…"}.
func slackChallenge(body *parsedBody) (string, bool) {
	t, ok := body.pointer("/type")
	if !ok {
		return "", false
	}
	if s, _ := jsonpointer.ScalarText(t); s != "url_verification" {
		return "", false
	}
	v, ok := body.pointer("/challenge")
	if !ok {
		return "", false
	}
	return jsonpointer.ScalarText(v)
}

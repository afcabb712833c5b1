package receiver

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/effectsql"
	"github.com/idemd/idemd/internal/exactlyonce"
	"github.com/idemd/idemd/internal/jsonpointer"
	"github.com/idemd/idemd/outbox"
)

// source is a compiled Source.
type source struct {
	name      string
	path      string
	api       bool
	required  bool
	retention time.Duration
	bodyLimit int64
	verifier  verifier
	scheme    string
	msgID     IDSpec
	ignore    []string
	sql       string
	// sqlPositional is sql with $n for its named parameters, sqlParams their names in
	// order: rewritten once, at New, not per request.
	sqlPositional string
	sqlParams     []string
	fn            EffectFunc
	status        int
	publish       *Publish
	maxAttempts   int
	secretHdrs    map[string]bool
}

// Permanent marks an EffectFunc's error as permanent: the request fails the same way on every
// retry, so it is dead-lettered (webhooks) or answered and stored as 422 (API) instead of
// being retried.
func Permanent(err error) error { return exactlyonce.Permanent(err) }

func compileSource(ctx context.Context, pool *pgxpool.Pool, s Source) (*source, error) {
	if s.Name == "" {
		return nil, errors.New("name is required")
	}
	c := &source{
		name:        s.Name,
		path:        cmp.Or(s.Path, "/webhooks/"+s.Name),
		api:         s.Idempotency != nil,
		retention:   cmp.Or(s.Retention, RetentionDefault),
		bodyLimit:   cmp.Or(s.BodyLimit, BodyLimitDefault),
		scheme:      s.Verify.Scheme,
		msgID:       s.MessageID,
		sql:         s.Effect.SQL,
		fn:          s.Effect.Func,
		status:      cmp.Or(s.Effect.Status, StatusDefault),
		publish:     s.Publish,
		maxAttempts: cmp.Or(s.MaxAttempts, 1),
	}
	if !strings.HasPrefix(c.path, "/") {
		return nil, fmt.Errorf("path %q must start with /", c.path)
	}
	if c.api {
		c.required = s.Idempotency.Required
		c.retention = cmp.Or(s.Idempotency.Retention, IdempotencyRetentionDefault)
		if s.Idempotency.Retention < 0 {
			return nil, errors.New("idempotency.retention must not be negative")
		}
	}
	if s.Retention < 0 {
		return nil, errors.New("retention must not be negative")
	}
	if s.BodyLimit < 0 {
		return nil, errors.New("body_limit must not be negative")
	}
	if c.status < 200 || c.status > 299 {
		return nil, fmt.Errorf("effect.status must be a 2xx status, got %d", c.status)
	}
	if s.MaxAttempts < 0 {
		return nil, errors.New("max_attempts must not be negative")
	}
	v, err := newVerifier(s.Verify, s.AllowUnverified)
	if err != nil {
		return nil, err
	}
	c.verifier = v
	if s.Verify.Scheme == SchemeBearer && !c.api {
		return nil, errors.New("verify.scheme bearer is for API sources: set idempotency")
	}
	if s.MessageID.JSON != "" && s.MessageID.Header != "" {
		return nil, errors.New("message_id: set json or header, not both")
	}
	if s.MessageID.JSON != "" {
		if err := jsonpointer.Validate(s.MessageID.JSON); err != nil {
			return nil, fmt.Errorf("message_id.json: %w", err)
		}
	}
	if c.msgID == (IDSpec{}) && !c.api {
		switch c.scheme {
		case SchemeStripe:
			c.msgID = IDSpec{JSON: "/id"}
		case SchemeStandardWebhooks:
			c.msgID = IDSpec{Header: "Webhook-Id"}
		case SchemeGitHub:
			c.msgID = IDSpec{Header: "X-GitHub-Delivery"}
		case SchemeShopify:
			c.msgID = IDSpec{Header: "X-Shopify-Event-Id"}
		case SchemeSlack:
			c.msgID = IDSpec{JSON: "/event_id"}
		default:
			return nil, fmt.Errorf("message_id is required for verify.scheme %s", c.scheme)
		}
	}
	c.ignore = append(c.ignore, s.FingerprintIgnore...)
	if c.scheme == SchemeStripe {
		c.ignore = append(c.ignore, "/pending_webhooks")
	}
	c.secretHdrs = map[string]bool{
		"Authorization": true, "Cookie": true, "Proxy-Authorization": true,
		"Stripe-Signature": true, "Webhook-Signature": true, "Svix-Signature": true,
		"X-Hub-Signature": true, "X-Hub-Signature-256": true, "X-Shopify-Hmac-Sha256": true,
		"X-Slack-Signature": true,
	}
	if s.Verify.Header != "" {
		c.secretHdrs[http.CanonicalHeaderKey(s.Verify.Header)] = true
	}
	if c.sql != "" && c.fn != nil {
		return nil, errors.New("effect: set sql or func, not both")
	}
	if c.sql != "" {
		var err error
		if c.sqlPositional, c.sqlParams, err = compile(ctx, pool, c.sql); err != nil {
			return nil, fmt.Errorf("effect.sql does not prepare: %w", err)
		}
	}
	if p := c.publish; p != nil {
		if p.Topic == "" && p.Endpoint == "" {
			return nil, errors.New("publish.topic is required unless the event goes to an HTTP endpoint (publish.http)")
		}
		switch p.Body {
		case "", "payload":
		case "effect":
			if c.sql == "" && c.fn == nil {
				return nil, errors.New("publish.body effect needs an effect")
			}
		default:
			return nil, fmt.Errorf("publish.body must be payload or effect, got %q", p.Body)
		}
		if p.Key.JSON != "" && p.Key.Header != "" {
			return nil, errors.New("publish.key: set json or header, not both")
		}
	}
	return c, nil
}

// compile checks that sql uses known parameters only and prepares, and returns its
// positional form and parameter names (internal/effectsql).
func compile(ctx context.Context, pool *pgxpool.Pool, sql string) (string, []string, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return "", nil, err
	}
	defer conn.Release()
	return effectsql.Compile(ctx, conn.Conn(), sql)
}

// parsedBody decodes a JSON body once, on first use.
type parsedBody struct {
	raw  []byte
	done bool
	doc  any
	ok   bool
}

func (p *parsedBody) get() (any, bool) {
	if !p.done {
		p.done = true
		// One JSON value of valid text and nothing after it. encoding/json would turn
		// invalid UTF-8 and unpaired surrogates into U+FFFD, so two different ids could
		// read as one: jsonpointer.Decode refuses them.
		p.doc, p.ok = jsonpointer.Decode(p.raw)
	}
	return p.doc, p.ok
}

// pointer resolves a JSON pointer (RFC 6901) in the body.
func (p *parsedBody) pointer(ptr string) (any, bool) {
	doc, ok := p.get()
	if !ok {
		return nil, false
	}
	return jsonpointer.Get(doc, ptr)
}

// lookup finds the id spec's value in the request.
func lookup(spec IDSpec, h http.Header, body *parsedBody) string {
	if spec.Header != "" {
		v := h.Get(spec.Header)
		if v == "" && strings.EqualFold(spec.Header, "Webhook-Id") {
			v = h.Get("Svix-Id")
		}
		return v
	}
	if v, ok := body.pointer(spec.JSON); ok {
		s, _ := jsonpointer.Scalar(v)
		return s
	}
	return ""
}

// eventType is the provider's event type, where known.
func (s *source) eventType(h http.Header, body *parsedBody) string {
	var v any
	var ok bool
	switch s.scheme {
	case SchemeStripe, SchemeStandardWebhooks:
		v, ok = body.pointer("/type")
	case SchemeSlack:
		v, ok = body.pointer("/event/type")
	case SchemeGitHub:
		return h.Get("X-GitHub-Event")
	case SchemeShopify:
		return h.Get("X-Shopify-Topic")
	}
	if !ok {
		return ""
	}
	t, _ := jsonpointer.Scalar(v)
	return t
}

// cleanHeaders drops signatures, tokens and cookies.
func (s *source) cleanHeaders(h http.Header) map[string][]string {
	out := make(map[string][]string, len(h))
	for k, v := range h {
		if !s.secretHdrs[http.CanonicalHeaderKey(k)] {
			out[k] = v
		}
	}
	return out
}

// call is one request on its way to the unit of work.
type call struct {
	src       *source
	req       *Request
	body      *parsedBody
	eventType string
	// scope is the dedup scope (pipeline, tenant); it also keys the operation ids.
	scope string
	// pending, for a webhook in a group-committed batch, collects the statements of the
	// batch's effects so that they reach PostgreSQL in one round trip (see queueEffect).
	pending *pending
}

// pending holds the effect statements and outbox events queued by one try of a batch; the
// unit's Flush hook sends them in one round trip, in the batch's transaction.
type pending struct {
	tx     pgx.Tx
	batch  pgx.Batch
	events []outbox.Event
}

// queueable reports whether a webhook's effect can be queued rather than run: its result is
// not needed (a webhook answers "processed", and its event carries the payload) and it is
// SQL (a Go effect runs when it is called).
func (s *source) queueable() bool {
	return s.fn == nil && (s.publish == nil || s.publish.Body != "effect")
}

// queueEffect queues c's effect statement and outbox event on p instead of running them.
// Their errors surface at Flush: a permanent one makes the unit run the batch again with a
// savepoint around each effect, which then runs directly (m.Careful).
func (r *Receiver) queueEffect(p *pending, c *call) {
	if c.src.sql != "" {
		p.batch.Queue(c.src.sqlPositional, r.sqlArgs(c)...)
	}
	if c.src.publish != nil {
		p.events = append(p.events, r.publishEvent(c, nil))
	}
}

// flush is the unit's Flush hook: it sends what the current try queued.
func (r *Receiver) flush(ctx context.Context, tx pgx.Tx, msgs []*exactlyonce.Message) error {
	c, ok := msgs[0].Value.(*call)
	if !ok || c.pending == nil || c.pending.tx != tx {
		return nil // nothing queued in this try (a careful re-run, or an API message)
	}
	p := c.pending
	if len(p.events) > 0 {
		if err := r.outbox.Queue(&p.batch, p.events...); err != nil {
			return exactlyonce.Permanent(err)
		}
	}
	if p.batch.Len() == 0 {
		return nil
	}
	if err := tx.SendBatch(ctx, &p.batch).Close(); err != nil {
		return fmt.Errorf("error running the batch's effects: %w", err)
	}
	return nil
}

// runEffect runs the source's effect and publish in tx and returns the effect's result as
// JSON (nil without an effect or rows).
func (r *Receiver) runEffect(ctx context.Context, tx pgx.Tx, c *call) ([]byte, error) {
	var result []byte
	switch {
	case c.src.sql != "":
		rows, err := tx.Query(ctx, c.src.sqlPositional, r.sqlArgs(c)...)
		if err != nil {
			return nil, err
		}
		maps, err := pgx.CollectRows(rows, pgx.RowToMap)
		if err != nil {
			return nil, err
		}
		switch len(maps) {
		case 0:
		case 1:
			result, err = json.Marshal(maps[0])
		default:
			result, err = json.Marshal(maps)
		}
		if err != nil {
			return nil, exactlyonce.Permanent(fmt.Errorf("error encoding returned rows: %w", err))
		}
	case c.src.fn != nil:
		v, err := c.src.fn(ctx, tx, c.req)
		if err != nil {
			return nil, err
		}
		switch x := v.(type) {
		case nil:
		case json.RawMessage:
			result = x
		case []byte:
			result = x
		default:
			if result, err = json.Marshal(v); err != nil {
				return nil, exactlyonce.Permanent(fmt.Errorf("error encoding the effect's result: %w", err))
			}
		}
	}
	if c.src.publish != nil {
		if err := r.outbox.EnqueueTx(ctx, tx, r.publishEvent(c, result)); err != nil {
			return nil, err
		}
	}
	return result, nil
}

// sqlArgs are the arguments of c's SQL effect (SPEC 2.3), in the order of its positional
// parameters.
func (r *Receiver) sqlArgs(c *call) []any {
	args := make([]any, len(c.src.sqlParams))
	for i, name := range c.src.sqlParams {
		switch name {
		case "message_id":
			args[i] = c.req.MessageID
		case "payload":
			args[i] = string(c.req.Body)
		case "headers":
			hdrs := make(map[string]string, len(c.req.Header))
			for k, v := range c.req.Header {
				if len(v) > 0 {
					hdrs[k] = v[0]
				}
			}
			hj, _ := json.Marshal(hdrs)
			args[i] = string(hj)
		case "source":
			args[i] = c.src.name
		case "tenant":
			if c.req.Tenant != "" {
				args[i] = c.req.Tenant
			}
		case "key":
			if c.req.Key != "" {
				args[i] = c.req.Key
			}
		case "received_at":
			args[i] = c.req.ReceivedAt
		default: // topic, partition, offset: Kafka's, NULL over HTTP
		}
	}
	return args
}

// publishEvent is c's outbox event; result is the effect's JSON for Body "effect".
func (r *Receiver) publishEvent(c *call, result []byte) outbox.Event {
	p := c.src.publish
	payload, ctype := c.req.Body, "application/json"
	if p.Body == "effect" {
		payload = result
		if payload == nil {
			payload = []byte("null")
		}
	} else if _, ok := c.body.get(); !ok {
		ctype = "application/octet-stream"
	}
	ev := outbox.Event{
		Topic: p.Topic, Endpoint: p.Endpoint, Payload: payload, Pipeline: c.src.name, CausationID: c.req.MessageID,
		Headers: map[string]string{outbox.HeaderContentType: ctype},
	}
	if c.eventType != "" {
		ev.Headers[outbox.HeaderEventType] = c.eventType
	}
	if p.Key != (IDSpec{}) {
		if k := lookup(p.Key, c.req.Header, c.body); k != "" {
			ev.Key = []byte(k)
		}
	}
	// Set explicitly: queued events of a whole batch are enqueued in one call, where the
	// default would number them by position. Tenants share key spaces, so the id includes
	// the scope (pipeline and tenant), or a downstream consumer would drop tenant B's event
	// as tenant A's duplicate; for webhooks the scope is the pipeline.
	ev.OperationID = outbox.OperationID(c.scope, c.req.MessageID, 0)
	return ev
}

// autoKey names an API request sent without an Idempotency-Key where none is required: it
// runs once, as a new operation.
func autoKey() string { return "auto:" + uuid.NewString() }

package receiver

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/exactlyonce"
	"github.com/idemd/idemd/internal/effectsql"
	"github.com/idemd/idemd/internal/fingerprint"
	"github.com/idemd/idemd/internal/jsonpointer"
	"github.com/idemd/idemd/outbox"
	"github.com/idemd/idemd/pipeline"
	"github.com/idemd/idemd/processed"
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
	msgID     *pipeline.Field
	ignore    []string
	sql       string
	// stmt is sql compiled once, at New, not per request.
	stmt        *effectsql.Statement
	fn          EffectFunc
	status      int
	targets     pipeline.Targets
	order       *pipeline.Order
	maxAttempts int
	secretHdrs  map[string]bool
	// lookup serves GET {path}/{key}; del is the compiled DELETE {path}/{id} effect.
	lookup bool
	del    *effectsql.Statement
	// failures keeps its transient failures' error lines to one a second.
	failures failureLog
}

func compileSource(ctx context.Context, pool *pgxpool.Pool, s Source) (*source, error) {
	if s.Name == "" {
		return nil, errors.New("name is required")
	}
	c := &source{
		name:        s.Name,
		path:        s.RoutePath(),
		api:         s.Idempotency != nil,
		retention:   cmp.Or(s.Retention, pipeline.RetentionDefault),
		bodyLimit:   cmp.Or(s.BodyLimit, BodyLimitDefault),
		scheme:      s.Verify.Scheme,
		msgID:       s.MessageID,
		sql:         s.Effect.SQL,
		fn:          s.Effect.Func,
		status:      cmp.Or(s.Effect.Status, StatusDefault),
		targets:     s.Publish,
		order:       s.Order,
		maxAttempts: cmp.Or(s.MaxAttempts, pipeline.MaxAttemptsDefault),
	}
	if !strings.HasPrefix(c.path, "/") {
		return nil, fmt.Errorf("path %q must start with /", c.path)
	}
	if c.api {
		c.required = s.Idempotency.Required
		c.retention = cmp.Or(s.Idempotency.Retention, pipeline.IdempotencyRetentionDefault)
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
	if err := checkMessageID(s); err != nil {
		return nil, err
	}
	if s.Verify.Scheme == SchemeBearer && !c.api {
		return nil, errors.New("verify.scheme bearer is for API sources: set idempotency")
	}
	if s.MessageID != nil {
		if err := s.MessageID.Validate(false); err != nil {
			return nil, fmt.Errorf("message_id: %w", err)
		}
	}
	if c.msgID == nil && !c.api {
		switch c.scheme {
		case SchemeStripe:
			c.msgID = &pipeline.Field{JSON: "/id"}
		case SchemeStandardWebhooks:
			c.msgID = &pipeline.Field{Header: HeaderWebhookID}
		case SchemeGitHub:
			c.msgID = &pipeline.Field{Header: "X-GitHub-Delivery"}
		case SchemeShopify:
			c.msgID = &pipeline.Field{Header: "X-Shopify-Event-Id"}
		case SchemeSlack:
			c.msgID = &pipeline.Field{JSON: "/event_id"}
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
		HeaderStripeSignature: true, HeaderWebhookSignature: true, "Svix-Signature": true,
		"X-Hub-Signature": true, HeaderGitHubSignature: true, HeaderShopifySignature: true,
		HeaderSlackSignature: true,
	}
	if s.Verify.Header != "" {
		c.secretHdrs[http.CanonicalHeaderKey(s.Verify.Header)] = true
	}
	if c.sql != "" && c.fn != nil {
		return nil, errors.New("effect: set sql or func, not both")
	}
	if c.sql != "" {
		var err error
		if c.stmt, err = compile(ctx, pool, c.sql); err != nil {
			return nil, fmt.Errorf("effect.sql does not prepare: %w", err)
		}
	}
	if err := c.targets.Validate(false); err != nil {
		return nil, fmt.Errorf("publish%w", err)
	}
	for i, t := range c.targets {
		if t.Body == pipeline.BodyEffect && c.sql == "" && c.fn == nil {
			return nil, fmt.Errorf("publish[%d].body effect needs an effect", i)
		}
	}
	if err := c.compileAPI(ctx, pool, s); err != nil {
		return nil, err
	}
	if c.order != nil {
		if c.api {
			return nil, errors.New("order: the stale-event guard is for webhook sources")
		}
		if err := c.order.Validate(false); err != nil {
			return nil, fmt.Errorf("order: %w", err)
		}
	}
	return c, nil
}

// compile checks that sql uses known parameters only and prepares (internal/effectsql).
func compile(ctx context.Context, pool *pgxpool.Pool, sql string) (*effectsql.Statement, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	return effectsql.Prepare(ctx, conn.Conn(), sql)
}

// parsedBody is a request body in which JSON pointers are resolved. It is checked once, on
// first use, and never decoded whole: a pointer's value is read from the raw bytes
// (jsonpointer.Find), which is what decoding and resolving would give.
type parsedBody struct {
	raw  []byte
	done bool
	ok   bool
}

// checkedBy takes the verdict of a webhook's fingerprint, computed first: a body that has a
// canonical form is valid (fingerprint.BodyCanonical), so that it is not read a second time
// to say so; for one that has none, valid asks jsonpointer.Valid.
func (p *parsedBody) checkedBy(canonical bool) {
	if canonical {
		p.done, p.ok = true, true
	}
}

// valid reports whether the body is one JSON value of valid text and nothing after it.
// encoding/json would turn invalid UTF-8 and unpaired surrogates into U+FFFD, so two
// different ids could read as one: jsonpointer.Valid refuses them.
func (p *parsedBody) valid() bool {
	if !p.done {
		p.done, p.ok = true, jsonpointer.Valid(p.raw)
	}
	return p.ok
}

// pointer returns the raw JSON value a JSON pointer (RFC 6901) names in the body.
func (p *parsedBody) pointer(ptr string) ([]byte, bool) {
	if !p.valid() {
		return nil, false
	}
	return jsonpointer.Find(p.raw, ptr)
}

// lookup finds a webhook's message id in the request: spec's header, or its JSON member (a
// string, or a number used as written, so that 1500 and "1500" are one id), or each part of
// a composite. The error is the 400's detail: what was wrong, and what is accepted.
func lookup(spec *pipeline.Field, h http.Header, body *parsedBody) (string, error) {
	var bad error
	v, _ := spec.Read(func(f *pipeline.Field) (string, bool) {
		v, err := lookupOne(f, h, body)
		if err != nil && bad == nil {
			bad = err
		}
		return v, err == nil && v != ""
	})
	switch {
	case bad != nil:
		return "", fmt.Errorf("%w; want %s", bad, idWanted(spec))
	case !processed.ValidID(v):
		return "", fmt.Errorf("the message id is missing, empty, longer than %d bytes or holds control characters; want %s",
			processed.MaxIDLength, idWanted(spec))
	}
	return v, nil
}

// lookupOne reads one part of a message id: a field of the request (fieldValue), refusing
// what cannot be an id. "" when it is missing.
func lookupOne(spec *pipeline.Field, h http.Header, body *parsedBody) (string, error) {
	if spec.Header != "" {
		name := spec.Header
		if len(h.Values(name)) == 0 && strings.EqualFold(name, "Webhook-Id") {
			name = "Svix-Id"
		}
		if n := len(h.Values(name)); n > 1 {
			// Which one would the sender have us dedupe on? As for two Idempotency-Keys.
			return "", fmt.Errorf("the request has %d %s headers", n, name)
		}
		return h.Get(name), nil
	}
	if !body.valid() {
		return "", fmt.Errorf("the body is not valid JSON (one value, UTF-8 text, nothing after it), so it has no message id at %s", spec.JSON)
	}
	v, ok := body.pointer(spec.JSON)
	if !ok {
		return "", nil
	}
	switch v[0] {
	case 't', 'f':
		return "", fmt.Errorf("the message id at %s is a boolean", spec.JSON)
	case 'n':
		return "", fmt.Errorf("the message id at %s is null", spec.JSON)
	case '{':
		return "", fmt.Errorf("the message id at %s is an object", spec.JSON)
	case '[':
		return "", fmt.Errorf("the message id at %s is an array", spec.JSON)
	}
	s, _ := jsonpointer.ScalarText(v) // a string unescaped, a number as written
	return s, nil
}

// fieldValue finds the value of a plain field in the request (publish keys, filters, the
// stale guard's entity and version): the first of its header's values, or its JSON
// member's scalar text (booleans included).
func fieldValue(spec *pipeline.Field, h http.Header, body *parsedBody) string {
	if spec.Header != "" {
		v := h.Get(spec.Header)
		if v == "" && strings.EqualFold(spec.Header, HeaderWebhookID) {
			v = h.Get("Svix-Id")
		}
		return v
	}
	if v, ok := body.pointer(spec.JSON); ok {
		s, _ := jsonpointer.ScalarText(v)
		return s
	}
	return ""
}

// idWanted says what a webhook's message id must be, for the 400's detail.
func idWanted(spec *pipeline.Field) string {
	text := fmt.Sprintf("of 1 to %d bytes of text without control characters", processed.MaxIDLength)
	if len(spec.Parts) == 0 {
		return idSource(spec) + ", " + text
	}
	parts := make([]string, len(spec.Parts))
	for i := range spec.Parts {
		parts[i] = idSource(&spec.Parts[i])
	}
	return "each of " + strings.Join(parts, "; ") + ", the joined id " + text
}

func idSource(f *pipeline.Field) string {
	if f.Header != "" {
		return "one " + f.Header + " header"
	}
	return "a JSON string or number (used as written) at " + f.JSON
}

// eventType is the provider's event type, where known.
func (s *source) eventType(h http.Header, body *parsedBody) string {
	var v []byte
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
	t, _ := jsonpointer.ScalarText(v)
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

// call is one request on its way to the unit of work: what the door read of it.
type call struct {
	src       *source
	req       *Request
	body      *parsedBody
	eventType string
	// fp is a webhook's fingerprint, computed as Receiver.serve makes the call; nil for an
	// API request and a replayed letter, whose message computes its own.
	fp []byte
	// scope is the dedup scope (pipeline, tenant); it also keys the operation ids.
	scope string
	// trace is the message's trace context (the request's span, or its traceparent), and
	// span the request's span (a no-op one with tracing off).
	trace trace.SpanContext
	span  trace.Span
	// letter and request are the call's dead letter, kept here rather than allocated on
	// their own: nearly every call is applied, not dead-lettered.
	letter  deadletter.Letter
	request deadletter.Request
}

// Field reads a plain field of the request (pipeline.Message).
func (c *call) Field(f *pipeline.Field) (string, bool) {
	v := fieldValue(f, http.Header(c.req.Header), c.body)
	return v, v != ""
}

// EventType is the provider's event type (pipeline.Message).
func (c *call) EventType() string { return c.eventType }

// message is the unit-of-work message of a call: its key, fingerprint, bound effect,
// event, and — for a webhook — its dead letter, or — for an API request — its answer.
func (s *source) message(c *call) *exactlyonce.Message {
	m := &exactlyonce.Message{
		Scope: c.scope, ID: c.req.MessageID,
		Payload:     c.req.Body,
		Retention:   s.retention,
		MaxAttempts: s.maxAttempts,
		Effect:      s.effect(c),
		Events:      s.events(c),
		Trace:       c.trace,
	}
	if s.api {
		m.Fingerprint = fingerprint.Request(c.req.Method, c.req.Path, c.req.Body)
		m.Answer = &exactlyonce.Answer{
			Status: s.status,
			Empty:  statusBody("processed", c.req.Key),
			Failed: s.failedAnswer(c.req.Key),
		}
		return m
	}
	m.Fingerprint = c.fp
	if m.Fingerprint == nil { // a replayed letter's call
		m.Fingerprint = fingerprint.Body(c.req.Body, s.ignore...)
	}
	if s.order != nil {
		if entity, version, err := s.order.Read(c.Field); err != nil {
			m.Invalid = err // dead-lettered, replayable once the sender's data or the order is fixed
		} else {
			m.Guard = &exactlyonce.Guard{Scope: s.name, Entity: entity, Version: version}
		}
	}
	if s.unsignedID() {
		// The id comes from a header the signature does not cover: claim the signed bytes
		// too, so that resending them under a fresh id is a duplicate, not a second effect.
		sum := sha256.Sum256(c.req.Body)
		m.Also = []exactlyonce.Key{{Scope: processed.BodyScope(c.scope), ID: "sha256:" + hex.EncodeToString(sum[:]), Fingerprint: sum[:]}}
	}
	c.request = deadletter.Request{Method: c.req.Method, Path: c.req.Path, Tenant: c.req.Tenant}
	c.letter = deadletter.Letter{
		Pipeline: s.name, Origin: deadletter.Origin{Door: deadletter.DoorHTTP},
		Scope: c.scope, MessageID: c.req.MessageID, Payload: c.req.Body, Headers: c.req.Header,
		Request: &c.request,
	}
	m.Letter = &c.letter
	return m
}

// unsignedID: the scheme signs the body only and the id is read from a header, which an
// attacker who captured one signed request can change at will.
func (s *source) unsignedID() bool {
	switch s.scheme {
	case SchemeGitHub, SchemeShopify, SchemeHMACSHA256:
		return s.msgID.UsesHeader()
	}
	return false
}

// effect binds the source's effect to the call: its SQL with the SPEC 2.3 values of the
// request, or its Go function.
func (s *source) effect(c *call) exactlyonce.Effect {
	var e exactlyonce.Effect
	if s.stmt != nil {
		v := &effectsql.Values{
			MessageID: c.req.MessageID, Payload: c.req.Body, Headers: firstValues(c.req.Header), Source: s.name,
			Tenant: c.req.Tenant, ReceivedAt: c.req.ReceivedAt,
		}
		if c.req.Key != "" {
			v.Key = []byte(c.req.Key)
		}
		e.SQL, e.Args, e.Many = s.stmt.SQL, s.stmt.Bind(v), s.stmt.Many
	}
	if s.fn != nil {
		fn, req := s.fn, c.req
		e.Func = func(ctx context.Context, tx pgx.Tx) (any, error) { return fn(ctx, tx, req) }
	}
	return e
}

// events are the call's outbox events, one per target its filter lets through; a target
// with Body "effect" publishes the effect's result.
func (s *source) events(c *call) []exactlyonce.Event {
	if len(s.targets) == 0 {
		return nil
	}
	ctype := "application/json"
	if !c.body.valid() {
		ctype = "application/octet-stream"
	}
	base := outbox.Event{Payload: c.req.Body, Headers: map[string]string{outbox.HeaderContentType: ctype}}
	if c.eventType != "" {
		base.Headers[outbox.HeaderEventType] = c.eventType
	}
	// Tenants share key spaces, so the operation ids derive from the scope (pipeline and
	// tenant), or a downstream consumer would drop tenant B's event as tenant A's
	// duplicate; for webhooks the scope is the pipeline.
	routed := s.targets.Route(s.name, c.scope, c.req.MessageID, base, c)
	out := make([]exactlyonce.Event, len(routed))
	for i, r := range routed {
		fromResult := r.Target.Body == pipeline.BodyEffect
		if fromResult {
			r.Event.Headers[outbox.HeaderContentType] = "application/json"
		}
		out[i] = exactlyonce.Event{Event: r.Event, FromResult: fromResult}
	}
	return out
}

// autoKey names an API request sent without an Idempotency-Key where none is required: it
// runs once, as a new operation.
func autoKey() string { return "auto:" + uuid.NewString() }

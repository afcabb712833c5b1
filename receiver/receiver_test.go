package receiver

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/internal/outageproxy"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/pipeline"
)

const testSecret = "whsec_receiver_test"

type bundle struct {
	db  *pgtest.DB
	rcv *Receiver
	srv *httptest.Server
}

// setup gives a test its own schema with an effects table, a receiver built by cfg (which
// sees the schema, for its SQL) and an HTTP server in front of it.
func setup(t *testing.T, maxConns int32, cfg func(db *pgtest.DB) Config) *bundle {
	t.Helper()
	db := pgtest.NewWithOptions(t, pgtest.Options{MaxConns: maxConns})
	db.Exec(t, db.Q(`CREATE TABLE {schema}.effects (
		id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, message_id text, tenant text,
		body jsonb, amount bigint CHECK (amount >= 0))`))
	c := cfg(db)
	c.Schema = db.Schema
	r, err := New(db.Pool, &c)
	require.NoError(t, err)
	t.Cleanup(r.Close)
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	return &bundle{db: db, rcv: r, srv: srv}
}

func stripeSource(db *pgtest.DB) Source {
	return Source{
		Name:   "stripe",
		Verify: Verify{Scheme: SchemeStripe, Secrets: []string{"whsec_old_rotated_secret", testSecret}},
		Effect: Effect{SQL: db.Q(`INSERT INTO {schema}.effects (message_id, amount, body)
			VALUES (@message_id, (@payload::jsonb #>> '{data,object,amount}')::bigint, @headers::jsonb)`)},
		Publish: pipeline.Targets{{Topic: "webhooks.stripe", Key: &pipeline.Field{JSON: "/data/object/id"}}},
	}
}

func ordersSource(db *pgtest.DB) Source {
	return Source{
		Name:        "orders",
		Path:        "/v1/orders",
		Verify:      Verify{Scheme: SchemeBearer, Tokens: map[string]string{"token-a-0123456789": "a", "token-b-0123456789": "b"}},
		Idempotency: &Idempotency{Required: true},
		Effect: Effect{SQL: db.Q(`INSERT INTO {schema}.effects (tenant, message_id, body, amount)
			VALUES (@tenant, @key, @payload, (@payload::jsonb ->> 'amount')::bigint) RETURNING id, tenant`), Status: 201},
		Publish: pipeline.Targets{{Topic: "orders.created", Body: "effect"}},
	}
}

func stripeEvent(id string, amount int, extra string) []byte {
	return []byte(fmt.Sprintf(`{"id":%q,"object":"event","type":"payment_intent.succeeded","pending_webhooks":1%s,"data":{"object":{"id":"pi_1","amount":%d}}}`, id, extra, amount))
}

func stripeSig(secret string, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + hex.EncodeToString(hmacSHA256([]byte(secret), []byte(ts+"."), body))
}

type resp struct {
	status int
	header http.Header
	body   []byte
}

func (r resp) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(r.body, &m), "%s", r.body)
	return m
}

// problemType checks an RFC 9457 answer and returns its type fragment.
func (r resp) problemType(t *testing.T) string {
	t.Helper()
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"), "%s", r.body)
	m := r.json(t)
	require.Contains(t, m, "title")
	require.Contains(t, m, "retryable")
	require.EqualValues(t, r.status, m["status"])
	return strings.TrimPrefix(m["type"].(string), ProblemTypeBase)
}

func do(t *testing.T, client *http.Client, method, url string, body []byte, h http.Header) resp {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	require.NoError(t, err)
	for k, v := range h {
		req.Header[k] = v
	}
	if client == nil {
		client = http.DefaultClient
	}
	res, err := client.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return resp{res.StatusCode, res.Header, b}
}

func (b *bundle) stripe(t *testing.T, body []byte) resp {
	return do(t, nil, "POST", b.srv.URL+"/webhooks/stripe", body,
		http.Header{"Stripe-Signature": {stripeSig(testSecret, time.Now(), body)}})
}

func (b *bundle) order(t *testing.T, token, key, body string, extra ...string) resp {
	h := http.Header{"Authorization": {"Bearer " + token}, "Content-Type": {"application/json"}}
	if key != "" {
		h["Idempotency-Key"] = []string{key}
	}
	for i := 0; i+1 < len(extra); i += 2 {
		h[http.CanonicalHeaderKey(extra[i])] = append(h[http.CanonicalHeaderKey(extra[i])], extra[i+1])
	}
	return do(t, nil, "POST", b.srv.URL+"/v1/orders", []byte(body), h)
}

func (b *bundle) effects(t *testing.T) int { return b.db.Count(t, "{schema}.effects") }

// TestWebhookStatusTable walks SPEC 2.4 for a webhook source (the in-flight row is
// TestConcurrentWebhooks).
func TestWebhookStatusTable(t *testing.T) {
	t.Parallel()
	b := setup(t, 8, func(db *pgtest.DB) Config { return Config{Sources: []Source{stripeSource(db)}} })

	// New id: processed, one effect, one outbox row, secrets not in @headers.
	r := b.stripe(t, stripeEvent("evt_1", 100, ""))
	require.Equal(t, 200, r.status, "%s", r.body)
	require.Equal(t, map[string]any{"status": "processed", "message_id": "evt_1"}, r.json(t))
	require.Equal(t, 1, b.effects(t))
	require.Equal(t, 1, b.db.Count(t, "{schema}.outbox WHERE topic = 'webhooks.stripe' AND key = 'pi_1' AND headers->>'event-type' = 'payment_intent.succeeded'"))
	require.Equal(t, 0, b.db.Count(t, "{schema}.effects WHERE body ? 'Stripe-Signature'"))

	// Same id, same fingerprint (pending_webhooks changes between retries): duplicate.
	r = b.stripe(t, []byte(strings.Replace(string(stripeEvent("evt_1", 100, "")), `"pending_webhooks":1`, `"pending_webhooks":3`, 1)))
	require.Equal(t, 200, r.status)
	require.Equal(t, "duplicate", r.json(t)["status"])
	require.Equal(t, "true", r.header.Get("Idempotent-Replayed"))
	require.Equal(t, 1, b.effects(t))

	// Same id, different payload: 422, recorded, no effect.
	r = b.stripe(t, stripeEvent("evt_1", 999, ""))
	require.Equal(t, 422, r.status)
	require.Equal(t, "conflict", r.problemType(t))
	require.Equal(t, 1, b.effects(t))
	require.Equal(t, 1, b.db.Count(t, "{schema}.conflicts WHERE message_id = 'evt_1'"))

	// Signature missing, wrong, or outside the tolerance: 401, nothing run.
	body := stripeEvent("evt_2", 1, "")
	for _, h := range []http.Header{
		{},
		{"Stripe-Signature": {stripeSig("whsec_wrong", time.Now(), body)}},
		{"Stripe-Signature": {stripeSig(testSecret, time.Now().Add(-10*time.Minute), body)}},
		{"Stripe-Signature": {stripeSig(testSecret, time.Now().Add(10*time.Minute), body)}},
	} {
		r = do(t, nil, "POST", b.srv.URL+"/webhooks/stripe", body, h)
		require.Equal(t, 401, r.status)
		require.Equal(t, "invalid-signature", r.problemType(t))
		require.NotContains(t, string(r.body), testSecret)
	}
	// Message id missing or malformed: 400.
	r = b.stripe(t, []byte(`{"object":"event"}`))
	require.Equal(t, 400, r.status)
	require.Equal(t, "missing-message-id", r.problemType(t))
	r = b.stripe(t, stripeEvent(strings.Repeat("e", 256), 1, ""))
	require.Equal(t, 400, r.status)
	require.Equal(t, 1, b.effects(t))

	// Effect fails permanently (CHECK constraint): 202 dead_lettered, raw request kept
	// without its signature; a redelivery is a duplicate.
	r = b.stripe(t, stripeEvent("evt_bad", -5, ""))
	require.Equal(t, 202, r.status, "%s", r.body)
	require.Equal(t, "dead_lettered", r.json(t)["status"])
	require.Equal(t, 1, b.effects(t))
	letters, err := deadletter.New(b.db.Schema).List(context.Background(), b.db.Pool, deadletter.Filter{Pipeline: "stripe"})
	require.NoError(t, err)
	require.Len(t, letters, 1)
	require.Equal(t, "evt_bad", letters[0].MessageID)
	require.Equal(t, stripeEvent("evt_bad", -5, ""), letters[0].Payload)
	require.NotContains(t, letters[0].Headers, "Stripe-Signature")
	require.Contains(t, letters[0].Reason, "23514")
	require.Equal(t, map[string]any{"method": "POST", "path": "/webhooks/stripe", "tenant": ""}, letters[0].Metadata,
		"the request's method, path and tenant are the letter's metadata")
	r = b.stripe(t, stripeEvent("evt_bad", -5, ""))
	require.Equal(t, 200, r.status)
	require.Equal(t, "duplicate", r.json(t)["status"])
	require.Equal(t, 0, b.db.Count(t, "{schema}.outbox WHERE causation_id = 'evt_bad'"))

	// Replay after the cause is fixed: applied once.
	b.db.Exec(t, b.db.Q(`ALTER TABLE {schema}.effects DROP CONSTRAINT effects_amount_check`))
	rp := deadletter.NewReplayer(b.db.Pool, deadletter.New(b.db.Schema))
	b.rcv.RegisterReplay(rp)
	_, err = rp.Replay(context.Background(), letters[0].ID)
	require.NoError(t, err)
	_, err = rp.Replay(context.Background(), letters[0].ID)
	require.ErrorIs(t, err, deadletter.ErrAlreadyReplayed)
	require.Equal(t, 1, b.db.Count(t, "{schema}.effects WHERE message_id = 'evt_bad'"))
	require.Equal(t, 1, b.db.Count(t, "{schema}.outbox WHERE causation_id = 'evt_bad'"))
}

// TestLimits covers 413 (declared and chunked), 405 with Allow, 404.
func TestLimits(t *testing.T) {
	t.Parallel()
	b := setup(t, 4, func(db *pgtest.DB) Config {
		s, o := stripeSource(db), ordersSource(db)
		s.BodyLimit, o.BodyLimit = 64, 64
		return Config{Sources: []Source{s, o}}
	})
	big := stripeEvent("evt_big", 1, `,"pad":"`+strings.Repeat("x", 100)+`"`)
	r := b.stripe(t, big)
	require.Equal(t, 413, r.status)
	require.Equal(t, "body-too-large", r.problemType(t))

	// Chunked: no Content-Length, counted while reading.
	pr, pw := io.Pipe()
	go func() { _, _ = pw.Write(big); _ = pw.Close() }()
	req, err := http.NewRequest("POST", b.srv.URL+"/webhooks/stripe", pr)
	require.NoError(t, err)
	req.Header.Set("Stripe-Signature", stripeSig(testSecret, time.Now(), big))
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_ = res.Body.Close()
	require.Equal(t, 413, res.StatusCode)

	r = do(t, nil, "GET", b.srv.URL+"/webhooks/stripe", nil, nil)
	require.Equal(t, 405, r.status)
	require.Equal(t, "POST", r.header.Get("Allow"))
	require.Equal(t, "method-not-allowed", r.problemType(t))
	r = do(t, nil, "DELETE", b.srv.URL+"/v1/orders/k1", nil, nil)
	require.Equal(t, 405, r.status)
	require.Equal(t, "PUT", r.header.Get("Allow"))
	r = do(t, nil, "POST", b.srv.URL+"/webhooks/nope", nil, nil)
	require.Equal(t, 404, r.status)
	require.Equal(t, "not-found", r.problemType(t))
	r = b.order(t, "token-a-0123456789", "k", `{"amount":1,"pad":"`+strings.Repeat("y", 80)+`"}`)
	require.Equal(t, 413, r.status)
	require.Equal(t, 0, b.effects(t))
}

// TestTransientFailure: 503 + Retry-After, nothing stored, and the retry runs at once.
func TestTransientFailure(t *testing.T) {
	t.Parallel()
	var failing atomic.Bool
	failing.Store(true)
	b := setup(t, 4, func(db *pgtest.DB) Config {
		effect := func(ctx context.Context, tx pgx.Tx, r *Request) (any, error) {
			if failing.Load() {
				return nil, errors.New("downstream unavailable")
			}
			var id int64
			err := tx.QueryRow(ctx, db.Q(`INSERT INTO {schema}.effects (message_id, tenant) VALUES ($1, $2) RETURNING id`),
				r.MessageID, r.Tenant).Scan(&id)
			return map[string]any{"id": id}, err
		}
		return Config{
			ApplyTimeout: 300 * time.Millisecond,
			Sources: []Source{
				{Name: "gh", Verify: Verify{Scheme: SchemeGitHub, Secrets: []string{ghSecret}}, Effect: Effect{Func: effect}},
				{Name: "api", Verify: Verify{Scheme: SchemeBearer, Tokens: map[string]string{"token-t-0123456789": "a"}},
					Idempotency: &Idempotency{Required: true}, Effect: Effect{Func: effect, Status: 201}},
			},
		}
	})
	ghPost := func() resp {
		return do(t, nil, "POST", b.srv.URL+"/webhooks/gh", []byte(ghBody), http.Header{
			"X-Hub-Signature-256": {ghSig}, "X-Github-Delivery": {"d-1"}, "X-Github-Event": {"push"}})
	}
	r := ghPost()
	require.Equal(t, 503, r.status)
	require.Equal(t, "1", r.header.Get("Retry-After"))
	require.Equal(t, "unavailable", r.problemType(t))
	require.Equal(t, true, r.json(t)["retryable"])
	apiPost := func() resp {
		return do(t, nil, "POST", b.srv.URL+"/webhooks/api", []byte(`{"n":1}`), http.Header{
			"Authorization": {"Bearer token-t-0123456789"}, "Idempotency-Key": {"k1"}})
	}
	r = apiPost()
	require.Equal(t, 503, r.status)
	require.NotEmpty(t, r.header.Get("Retry-After"))
	require.Equal(t, 0, b.db.Count(t, "{schema}.processed_messages"))
	require.Equal(t, 0, b.effects(t))

	failing.Store(false)
	require.Equal(t, 200, until503Passes(ghPost).status)
	r = until503Passes(apiPost)
	require.Equal(t, 201, r.status, "%s", r.body)
	require.Equal(t, 2, b.effects(t))
}

// TestMessageIDRead: a message id is one header value, or a JSON string or number (a number
// is its text as written: 1500 and "1500" are one id); two headers, and booleans, null,
// objects and arrays, are 400 with a detail that says what is accepted.
func TestMessageIDRead(t *testing.T) {
	t.Parallel()
	b := setup(t, 4, func(db *pgtest.DB) Config {
		return Config{Sources: []Source{
			stripeSource(db),
			{Name: "gh", Verify: Verify{Scheme: SchemeGitHub, Secrets: []string{ghSecret}}},
			{Name: "open", Verify: Verify{Scheme: SchemeNone}, AllowUnverified: true, MessageID: &pipeline.Field{Header: "X-Id"}},
		}}
	})
	refused := func(r resp, detail ...string) {
		t.Helper()
		require.Equal(t, 400, r.status, "%s", r.body)
		require.Equal(t, "missing-message-id", r.problemType(t))
		for _, d := range detail {
			require.Contains(t, r.json(t)["detail"], d)
		}
	}
	gh := func(ids ...string) resp {
		return do(t, nil, "POST", b.srv.URL+"/webhooks/gh", []byte(ghBody), http.Header{
			"X-Hub-Signature-256": {ghSig}, "X-Github-Delivery": ids, "X-Github-Event": {"push"}})
	}
	refused(gh("dd3", "dd4"), "2 X-GitHub-Delivery headers", "want one X-GitHub-Delivery header")
	refused(gh(), "missing", "want one X-GitHub-Delivery header")
	open := func(ids ...string) resp {
		return do(t, nil, "POST", b.srv.URL+"/webhooks/open", []byte(`{}`), http.Header{"X-Id": ids})
	}
	refused(open("o2", "o3"), "2 X-Id headers")
	require.Equal(t, 200, open("o2").status)

	for kind, id := range map[string]string{"a boolean": "true", "null": "null", "an object": `{"a":1}`, "an array": `["a"]`} {
		refused(b.stripe(t, []byte(`{"id":`+id+`}`)), "at /id is "+kind, "want a JSON string or number (used as written) at /id")
	}
	for _, body := range []string{`{"id":"evt_m1", broken`, `{"id":"evt_m2"} {}`, "{\"id\":\"evt_\xff\"}"} {
		refused(b.stripe(t, []byte(body)), "the body is not valid JSON", "want a JSON string or number (used as written) at /id")
	}
	r := b.stripe(t, []byte(`{"id":1500}`))
	require.Equal(t, 200, r.status, "%s", r.body)
	require.Equal(t, map[string]any{"status": "processed", "message_id": "1500"}, r.json(t))
	r = b.stripe(t, []byte(`{"id":"1500"}`))
	require.Equal(t, 422, r.status, "the number and the string are one id: another payload under it")
	require.Zero(t, b.db.Count(t, "{schema}.processed_messages WHERE message_id IN ('dd3', 'dd4', 'true', 'null')"))
}

// TestDatabaseOutageAnswers503Promptly: while PostgreSQL cannot be reached, a webhook and
// an API request are answered 503 with Retry-After well before ApplyTimeout (SPEC 3.2: a
// few hundred milliseconds; Shopify gives up after 5 s), nothing is stored, and once the
// database is back the sender's retry is applied once.
func TestDatabaseOutageAnswers503Promptly(t *testing.T) {
	t.Parallel()
	b, proxy := outageSetup(t, quietLogger())
	db := b.db

	require.Equal(t, 200, b.stripe(t, stripeEvent("evt_before", 1, "")).status)
	proxy.SetDown(true)
	for _, send := range []func() resp{
		func() resp { return b.stripe(t, stripeEvent("evt_outage", 1, "")) },
		func() resp { return b.order(t, "token-a-0123456789", "k-outage", `{"amount":1}`) },
	} {
		start := time.Now()
		r := send()
		took := time.Since(start)
		require.Equal(t, 503, r.status, "%s", r.body)
		require.Equal(t, "unavailable", r.problemType(t))
		require.Equal(t, "1", r.header.Get("Retry-After"))
		// ApplyTimeout is 5 s: the answer does not wait for it.
		require.Less(t, took, time.Second, "answered after %s", took)
	}
	proxy.SetDown(false)
	require.Equal(t, 1, b.effects(t), "nothing stored during the outage")
	require.Equal(t, 1, db.Count(t, "{schema}.processed_messages"))
	require.Equal(t, 200, until503Passes(func() resp { return b.stripe(t, stripeEvent("evt_outage", 1, "")) }).status)
	require.Equal(t, 201, until503Passes(func() resp { return b.order(t, "token-a-0123456789", "k-outage", `{"amount":1}`) }).status)
	require.Equal(t, 3, b.effects(t))
}

// outageSetup is a receiver with the stripe and orders sources, logging to log, whose pool
// reaches PostgreSQL through proxy, which the test takes down.
func outageSetup(t *testing.T, log *logrus.Entry) (*bundle, *outageproxy.Proxy) {
	t.Helper()
	db := pgtest.New(t)
	db.Exec(t, db.Q(`CREATE TABLE {schema}.effects (
		id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, message_id text, tenant text,
		body jsonb, amount bigint CHECK (amount >= 0))`))
	pool, proxy := pgtest.OutagePool(t, 4)
	r, err := New(pool, &Config{Schema: db.Schema, Logger: log, Sources: []Source{stripeSource(db), ordersSource(db)}})
	require.NoError(t, err)
	t.Cleanup(r.Close)
	return &bundle{db: db, rcv: r, srv: newServer(t, r)}, proxy
}

// until503Passes sends again, as a sender would, while the answer is 503 (at most 20
// times). Tests with a short ApplyTimeout use it once the cause of their 503 is gone: on a
// loaded machine (CI under -race) a transaction can itself outlive a short timeout.
func until503Passes(send func() resp) resp {
	r := send()
	for i := 0; i < 20 && r.status == http.StatusServiceUnavailable; i++ {
		r = send()
	}
	return r
}

func newServer(t *testing.T, h http.Handler) *httptest.Server {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }

// TestSignedBodyUnderFreshIDs: GitHub signs the body only, so X-GitHub-Delivery is not
// authenticated. One captured signed body resent with fresh delivery ids must run its effect
// once: the later ones are duplicates (the body's hash is claimed with the id).
func TestSignedBodyUnderFreshIDs(t *testing.T) {
	t.Parallel()
	b := setup(t, 4, func(db *pgtest.DB) Config {
		return Config{Sources: []Source{{Name: "gh", Verify: Verify{Scheme: SchemeGitHub, Secrets: []string{ghSecret}},
			Effect: Effect{SQL: db.Q(`INSERT INTO {schema}.effects (message_id) VALUES (@message_id)`)}}}}
	})
	post := func(delivery string) resp {
		return do(t, nil, "POST", b.srv.URL+"/webhooks/gh", []byte(ghBody), http.Header{
			"X-Hub-Signature-256": {ghSig}, "X-Github-Delivery": {delivery}, "X-Github-Event": {"push"}})
	}
	r := post("d-1")
	require.Equal(t, 200, r.status)
	require.Equal(t, "processed", r.json(t)["status"])
	for _, d := range []string{"d-2", "d-3", "d-4"} {
		r := post(d)
		require.Equal(t, 200, r.status)
		require.Equal(t, "duplicate", r.json(t)["status"], "delivery %s", d)
		require.Equal(t, "true", r.header.Get("Idempotent-Replayed"))
	}
	require.Equal(t, 1, b.effects(t), "one signed body, one effect")
}

// TestSlackURLVerification: Slack's Events API enables an endpoint only once it echoes the
// challenge of a signed url_verification request. idemd answers it (200, the challenge)
// without recording or applying anything; unsigned, it is refused like any request; an
// event is applied as before.
func TestSlackURLVerification(t *testing.T) {
	t.Parallel()
	const secret = "slack-signing-secret-0123"
	b := setup(t, 4, func(db *pgtest.DB) Config {
		return Config{Sources: []Source{{
			Name:   "slack",
			Verify: Verify{Scheme: SchemeSlack, Secrets: []string{secret}},
			Effect: Effect{SQL: db.Q(`INSERT INTO {schema}.effects (message_id) VALUES (@message_id)`)},
		}}}
	})
	post := func(body string, sign bool) resp {
		ts := strconv.FormatInt(time.Now().Unix(), 10)
		h := http.Header{"X-Slack-Request-Timestamp": {ts}, "Content-Type": {"application/json"}}
		if sign {
			h.Set("X-Slack-Signature", "v0="+hex.EncodeToString(hmacSHA256([]byte(secret), []byte("v0:"+ts+":"), []byte(body))))
		}
		return do(t, nil, "POST", b.srv.URL+"/webhooks/slack", []byte(body), h)
	}
	challenge := `{"token":"Jhj5dZrVaK7ZwHHjRyZWjbDl","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}`
	r := post(challenge, true)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Equal(t, "application/json", r.header.Get("Content-Type"))
	require.JSONEq(t, `{"challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"}`, string(r.body))
	require.Equal(t, 0, b.db.Count(t, "{schema}.processed_messages"), "nothing recorded")

	unsigned := post(challenge, false)
	require.Equal(t, http.StatusUnauthorized, unsigned.status)
	require.NotContains(t, string(unsigned.body), "3eZbrw1a")

	event := post(`{"type":"event_callback","event_id":"Ev1","event":{"type":"message"}}`, true)
	require.Equal(t, http.StatusOK, event.status, "%s", event.body)
	require.Equal(t, "processed", event.json(t)["status"])
	require.Equal(t, 1, b.effects(t))
}

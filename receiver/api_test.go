package receiver

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/pipeline"
)

// TestAPIStatusTable walks SPEC 2.4 for an API source (in flight: TestAPIInFlight;
// transient failures: TestTransientFailure; lease takeover: TestCrashAPI).
func TestAPIStatusTable(t *testing.T) {
	t.Parallel()
	b := setup(t, 8, func(db *pgtest.DB) Config { return Config{Sources: []Source{ordersSource(db)}} })

	// New key: effect.status, body = returned row.
	first := b.order(t, "token-a-0123456789", "k1", `{"amount": 5, "sku": "x"}`)
	require.Equal(t, 201, first.status, "%s", first.body)
	require.Equal(t, "a", first.json(t)["tenant"])
	require.Empty(t, first.header.Get("Idempotent-Replayed"))
	require.Equal(t, 1, b.effects(t))
	require.Equal(t, 1, b.db.Count(t, "{schema}.outbox WHERE topic = 'orders.created' AND payload = $1", first.body))

	// Same key, same request (whitespace and key order do not matter; "k1" is k1): replay.
	for _, key := range []string{"k1", `"k1"`} {
		r := b.order(t, "token-a-0123456789", key, `{"sku":"x","amount":5}`)
		require.Equal(t, 201, r.status)
		require.Equal(t, first.body, r.body, "byte-identical")
		require.Equal(t, "true", r.header.Get("Idempotent-Replayed"))
		require.Equal(t, first.header.Get("Content-Type"), r.header.Get("Content-Type"))
	}
	require.Equal(t, 1, b.effects(t))

	// Same key, different payload: 422, recorded.
	r := b.order(t, "token-a-0123456789", "k1", `{"amount": 6}`)
	require.Equal(t, 422, r.status)
	require.Equal(t, "conflict", r.problemType(t))
	require.Equal(t, 1, b.db.Count(t, "{schema}.conflicts"))

	// Bad or missing token: 401.
	r = b.order(t, "token-x", "k2", `{}`)
	require.Equal(t, 401, r.status)
	require.Equal(t, "unauthorized", r.problemType(t))
	require.NotContains(t, string(r.body), "token-x")
	r = do(t, nil, "POST", b.srv.URL+"/v1/orders", []byte(`{}`), http.Header{"Idempotency-Key": {"k2"}})
	require.Equal(t, 401, r.status)

	// Key missing or malformed: 400.
	for _, keys := range [][]string{nil, {strings.Repeat("k", 256)}, {"a", "b"}, {`"a", "b"`}, {"a,b"}, {"caf\u00e9"}} {
		h := http.Header{"Authorization": {"Bearer token-a-0123456789"}}
		if keys != nil {
			h["Idempotency-Key"] = keys
		}
		r = do(t, nil, "POST", b.srv.URL+"/v1/orders", []byte(`{"amount":1}`), h)
		require.Equal(t, 400, r.status, "%q", keys)
		require.Contains(t, []string{"missing-idempotency-key", "invalid-idempotency-key"}, r.problemType(t))
	}
	r = b.order(t, "token-a-0123456789", strings.Repeat("k", 255), `{"amount":1}`)
	require.Equal(t, 201, r.status, "255 characters are fine")
	require.Equal(t, 2, b.effects(t))

	// Permanent failure (CHECK): 422 stored and replayed, no effect.
	bad := b.order(t, "token-a-0123456789", "k-bad", `{"amount": -1}`)
	require.Equal(t, 422, bad.status)
	require.Equal(t, "effect-failed", bad.problemType(t))
	require.Contains(t, string(bad.body), "23514")
	again := b.order(t, "token-a-0123456789", "k-bad", `{"amount": -1}`)
	require.Equal(t, 422, again.status)
	require.Equal(t, bad.body, again.body)
	require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	require.Equal(t, 2, b.effects(t))

	// PUT {path}/{id}: the id is the key.
	put := func(body string) resp {
		return do(t, nil, "PUT", b.srv.URL+"/v1/orders/ord-7", []byte(body), http.Header{"Authorization": {"Bearer token-a-0123456789"}})
	}
	r = put(`{"amount": 7}`)
	require.Equal(t, 201, r.status, "%s", r.body)
	r2 := put(`{"amount": 7}`)
	require.Equal(t, r.body, r2.body)
	require.Equal(t, "true", r2.header.Get("Idempotent-Replayed"))
	require.Equal(t, 1, b.db.Count(t, "{schema}.effects WHERE message_id = 'ord-7'"))
	// The URL's key is the key: an Idempotency-Key header beside it, which the idempotent
	// clients send on every request, is not used (the same answer, whatever it names).
	for _, k := range []string{`"ord-7"`, "ord-8", `"ord-8"`, ""} {
		r2 = do(t, nil, "PUT", b.srv.URL+"/v1/orders/ord-7", []byte(`{"amount": 7}`), http.Header{"Authorization": {"Bearer token-a-0123456789"}, "Idempotency-Key": {k}})
		require.Equal(t, r.body, r2.body, "%q", k)
		require.Equal(t, "true", r2.header.Get("Idempotent-Replayed"))
	}
	require.Equal(t, 1, b.db.Count(t, "{schema}.effects WHERE message_id IN ('ord-7', 'ord-8')"))

	// After the retention the key is new (the record is aged rather than waited for).
	b.db.Exec(t, b.db.Q(`UPDATE {schema}.processed_messages SET expires_at = now() - interval '1 second' WHERE message_id = 'k1'`))
	r = b.order(t, "token-a-0123456789", "k1", `{"amount": 6}`)
	require.Equal(t, 201, r.status)
	require.NotEqual(t, first.body, r.body)
	require.Equal(t, 2, b.db.Count(t, "{schema}.effects WHERE message_id = 'k1'"))
}

// TestEmptyKeyRefusedWhereKeysAreOptional: on a source whose key is optional, an empty or
// blank Idempotency-Key is refused (400), not taken for no key: the client meant to send
// one, and would otherwise run its effect again on every retry.
func TestEmptyKeyRefusedWhereKeysAreOptional(t *testing.T) {
	t.Parallel()
	b := setup(t, 8, func(db *pgtest.DB) Config {
		src := ordersSource(db)
		src.Idempotency = &Idempotency{}
		return Config{Sources: []Source{src}}
	})
	for _, k := range []string{"", "   ", "\t"} {
		r := do(t, nil, "POST", b.srv.URL+"/v1/orders", []byte(`{"amount":1}`),
			http.Header{"Authorization": {"Bearer token-a-0123456789"}, "Idempotency-Key": {k}})
		require.Equal(t, 400, r.status, "%q: %s", k, r.body)
		require.Equal(t, "invalid-idempotency-key", r.problemType(t))
		require.Contains(t, string(r.body), "Idempotency-Key is empty")
	}
	require.Equal(t, 0, b.effects(t))
	r := do(t, nil, "POST", b.srv.URL+"/v1/orders", []byte(`{"amount":1}`), http.Header{"Authorization": {"Bearer token-a-0123456789"}})
	require.Equal(t, 201, r.status, "without the header, the request runs under a key of its own: %s", r.body)
	require.Equal(t, 1, b.effects(t))
}

// TestTenantIsolation: tenant B with tenant A's key gets its own result, never A's.
func TestTenantIsolation(t *testing.T) {
	t.Parallel()
	b := setup(t, 4, func(db *pgtest.DB) Config { return Config{Sources: []Source{ordersSource(db)}} })
	a := b.order(t, "token-a-0123456789", "shared", `{"amount": 1}`)
	require.Equal(t, 201, a.status)
	bb := b.order(t, "token-b-0123456789", "shared", `{"amount": 1}`)
	require.Equal(t, 201, bb.status)
	require.Empty(t, bb.header.Get("Idempotent-Replayed"))
	require.Equal(t, "b", bb.json(t)["tenant"])
	require.NotEqual(t, a.body, bb.body)
	// A different payload from B is not a conflict with A's either.
	require.Equal(t, 201, b.order(t, "token-b-0123456789", "shared2", `{"amount": 2}`).status)
	require.Equal(t, 201, b.order(t, "token-a-0123456789", "shared2", `{"amount": 3}`).status)
	require.Equal(t, 4, b.effects(t))
	// Their events have distinct operation ids.
	require.Equal(t, 4, b.db.Count(t, "(SELECT DISTINCT operation_id FROM {schema}.outbox) o"))
}

// TestAPIInFlight: while the first request runs, a retry gets 409 + Retry-After, a different
// payload 422, and Prefer: wait=N gets the stored result once the first commits.
func TestAPIInFlight(t *testing.T) {
	t.Parallel()
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	b := setup(t, 8, func(db *pgtest.DB) Config {
		return Config{Sources: []Source{{
			Name: "slow", Path: "/v1/slow",
			Verify:      Verify{Scheme: SchemeBearer, Tokens: map[string]string{"token-t-0123456789": "a"}},
			Idempotency: &Idempotency{Required: true},
			Effect: Effect{Func: func(ctx context.Context, tx pgx.Tx, r *Request) (any, error) {
				once.Do(func() { close(entered) })
				<-release
				_, err := tx.Exec(ctx, db.Q(`INSERT INTO {schema}.effects (message_id) VALUES ($1)`), r.Key)
				return map[string]string{"ok": r.Key}, err
			}},
		}}}
	})
	post := func(body string, extra ...string) resp {
		h := http.Header{"Authorization": {"Bearer token-t-0123456789"}, "Idempotency-Key": {"k"}}
		for i := 0; i+1 < len(extra); i += 2 {
			h.Set(extra[i], extra[i+1])
		}
		return do(t, nil, "POST", b.srv.URL+"/v1/slow", []byte(body), h)
	}
	firstc := make(chan resp, 1)
	go func() { firstc <- post(`{"a":1}`) }()
	<-entered

	r := post(`{"a":1}`)
	require.Equal(t, 409, r.status)
	require.Equal(t, "1", r.header.Get("Retry-After"))
	require.Equal(t, "in-flight", r.problemType(t))
	r = post(`{"a":2}`)
	require.Equal(t, 422, r.status, "a different payload is refused even while in flight")

	waitc := make(chan resp, 1)
	go func() { waitc <- post(`{"a":1}`, "Prefer", "wait=10") }()
	close(release)
	first, waited := <-firstc, <-waitc
	require.Equal(t, 200, first.status)
	require.Equal(t, 200, waited.status)
	require.Equal(t, first.body, waited.body)
	require.Equal(t, "true", waited.header.Get("Idempotent-Replayed"))
	require.Equal(t, 1, b.effects(t))
}

// TestConcurrentWebhooks: 50 identical deliveries at once, all 2xx, one effect, one event.
func TestConcurrentWebhooks(t *testing.T) {
	t.Parallel()
	b := setup(t, 20, func(db *pgtest.DB) Config { return Config{Sources: []Source{stripeSource(db)}} })
	body := stripeEvent("evt_same", 42, "")
	statuses := make([]int, 50)
	var wg sync.WaitGroup
	for i := range statuses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			statuses[i] = b.stripe(t, body).status
		}()
	}
	wg.Wait()
	for _, s := range statuses {
		require.Equal(t, 200, s)
	}
	require.Equal(t, 1, b.effects(t))
	require.Equal(t, 1, b.db.Count(t, "{schema}.outbox"))
}

// TestConcurrentAPI: 30 requests with one key at once: one effect; the others 409 or the
// replay of the first.
func TestConcurrentAPI(t *testing.T) {
	t.Parallel()
	b := setup(t, 20, func(db *pgtest.DB) Config { return Config{Sources: []Source{ordersSource(db)}} })
	out := make([]resp, 30)
	var wg sync.WaitGroup
	for i := range out {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = b.order(t, "token-a-0123456789", "one-key", `{"amount": 3}`)
		}()
	}
	wg.Wait()
	var created []byte
	for _, r := range out {
		switch r.status {
		case 201:
			if created == nil {
				created = r.body
			}
			require.Equal(t, created, r.body)
		case 409:
			require.NotEmpty(t, r.header.Get("Retry-After"))
		default:
			t.Fatalf("unexpected %d: %s", r.status, r.body)
		}
	}
	require.NotNil(t, created)
	require.Equal(t, 1, b.effects(t))
	require.Equal(t, 1, b.db.Count(t, "{schema}.outbox"))
}

func TestNewErrors(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWithOptions(t, pgtest.Options{MaxConns: 2})
	for _, tc := range []struct {
		src  Source
		want string
	}{
		{Source{Name: "x", Verify: Verify{Scheme: "none"}, MessageID: &pipeline.Field{Header: "X-Id"}}, `source 0 ("x"): verify.scheme none is refused`},
		{Source{Name: "x", Verify: Verify{Scheme: "github", Secrets: []string{"s-0123456789abcdef"}}, Effect: Effect{SQL: "INSERT INTO nowhere VALUES (@message_id)"}}, `source 0 ("x"): effect.sql does not prepare`},
		{Source{Name: "x", Verify: Verify{Scheme: "hmac-sha256", Secrets: []string{"s-0123456789abcdef"}, Header: "X-S"}}, "message_id is required"},
		{Source{Name: "x", Verify: Verify{Scheme: "github", Secrets: []string{"s-0123456789abcdef"}}, Publish: pipeline.Targets{{}}}, "publish[0]: want topic, pubsub, sqs or http"},
		{Source{Verify: Verify{Scheme: "github", Secrets: []string{"s-0123456789abcdef"}}}, "name is required"},
	} {
		_, err := New(db.Pool, &Config{Schema: db.Schema, Sources: []Source{tc.src}})
		require.ErrorContains(t, err, tc.want)
	}
	r, err := New(db.Pool, &Config{Schema: db.Schema, Sources: []Source{{Name: "x", Verify: Verify{Scheme: "none"},
		AllowUnverified: true, MessageID: &pipeline.Field{Header: "X-Id"}}}})
	require.NoError(t, err)
	r.Close()
	r.Close()
}

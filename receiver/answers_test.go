package receiver

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/exactlyonce"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/pipeline"
)

const (
	tokenA = "token-a-0123456789"
	tokenB = "token-b-0123456789"
)

// paymentsSource is SPEC 2.3b's payments source: a charge function that records every
// attempt and answers a declined card with http_status 402, key lookup, and a delete
// effect.
func paymentsSource(t *testing.T, db *pgtest.DB) Source {
	db.Exec(t, db.Q(`CREATE TABLE {schema}.payment_methods (tenant text NOT NULL, id text NOT NULL, PRIMARY KEY (tenant, id));
CREATE FUNCTION {schema}.charge(tenant text, key text, payload jsonb) RETURNS TABLE (http_status int, id bigint, error text)
LANGUAGE sql AS $$
    WITH attempt AS (
        INSERT INTO {schema}.effects (tenant, message_id, body, amount)
        VALUES (tenant, key, payload, (payload ->> 'amount')::bigint) RETURNING effects.id)
    SELECT CASE WHEN payload ->> 'card' = 'declined' THEN 402 WHEN payload ->> 'card' = 'odd' THEN 99 END,
           attempt.id,
           CASE WHEN payload ->> 'card' = 'declined' THEN 'card_declined' END
    FROM attempt
$$`))
	return Source{
		Name:        "payments",
		Path:        "/v1/payments",
		Verify:      Verify{Scheme: SchemeBearer, Tokens: map[string]string{tokenA: "a", tokenB: "b"}},
		Idempotency: &Idempotency{Required: true, Lookup: true},
		Effect:      Effect{SQL: db.Q(`SELECT * FROM {schema}.charge(@tenant, @key, @payload::jsonb)`), Status: 201},
		Publish:     pipeline.Targets{{Topic: "payments.created", Body: pipeline.BodyEffect}},
		Delete:      &Delete{SQL: db.Q(`DELETE FROM {schema}.payment_methods WHERE tenant = @tenant AND id = @message_id`)},
	}
}

func (b *bundle) pay(t *testing.T, token, method, path, key, body string) resp {
	h := http.Header{"Authorization": {"Bearer " + token}, "Content-Type": {"application/json"}}
	if key != "" {
		h["Idempotency-Key"] = []string{key}
	}
	return do(t, nil, method, b.srv.URL+"/v1/payments"+path, []byte(body), h)
}

// TestDeclinedCardReplayed: the effect's first row has http_status 402, so the answer is 402
// with the row without that column; every retry with the key gets it byte for byte, the
// charge attempt is recorded once, and nothing is published. An http_status that is not an
// HTTP status is a permanent failure (422, stored).
func TestDeclinedCardReplayed(t *testing.T) {
	t.Parallel()
	b := setup(t, 8, func(db *pgtest.DB) Config { return Config{Sources: []Source{paymentsSource(t, db)}} })

	declined := b.pay(t, tokenA, "POST", "", "k-declined", `{"amount": 5, "card": "declined"}`)
	require.Equal(t, 402, declined.status, "%s", declined.body)
	require.Equal(t, "application/json", declined.header.Get("Content-Type"))
	require.JSONEq(t, `{"id": 1, "error": "card_declined"}`, string(declined.body))
	require.NotContains(t, string(declined.body), "http_status")
	for range 3 {
		again := b.pay(t, tokenA, "POST", "", "k-declined", `{"card": "declined", "amount": 5}`)
		require.Equal(t, 402, again.status)
		require.Equal(t, declined.body, again.body, "byte for byte")
		require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
		require.Equal(t, declined.header.Get("Content-Type"), again.header.Get("Content-Type"))
	}
	require.Equal(t, 1, b.effects(t), "the declined attempt is recorded once")
	require.Equal(t, 0, b.db.Count(t, "{schema}.outbox"), "a business error publishes nothing")

	ok := b.pay(t, tokenA, "POST", "", "k-ok", `{"amount": 5, "card": "good"}`)
	require.Equal(t, 201, ok.status, "%s", ok.body)
	require.JSONEq(t, `{"id": 2, "error": null}`, string(ok.body), "a NULL http_status is a success; the column is dropped")
	require.Equal(t, 1, b.db.Count(t, "{schema}.outbox WHERE payload = $1", ok.body))

	odd := b.pay(t, tokenA, "POST", "", "k-odd", `{"amount": 5, "card": "odd"}`)
	require.Equal(t, 422, odd.status)
	require.Equal(t, "effect-failed", odd.problemType(t))
	require.Equal(t, odd.body, b.pay(t, tokenA, "POST", "", "k-odd", `{"amount": 5, "card": "odd"}`).body)
	require.Equal(t, 2, b.effects(t), "the failed attempt rolled back")
}

// TestGoBusinessErrorAndTransientFailure: a Go effect answers a business error with
// exactlyonce.BusinessError (stored, replayed, the handler runs once); a transient failure
// is answered 503 and never stored, so the retry with the same key runs the effect.
func TestGoBusinessErrorAndTransientFailure(t *testing.T) {
	t.Parallel()
	var runs, failures atomic.Int32
	failures.Store(1)
	b := setup(t, 8, func(db *pgtest.DB) Config {
		return Config{Sources: []Source{{
			Name:        "charges",
			Path:        "/v1/charges",
			Verify:      Verify{Scheme: SchemeBearer, Tokens: map[string]string{tokenA: "a"}},
			Idempotency: &Idempotency{Required: true, Lookup: true},
			Effect: Effect{Func: func(ctx context.Context, tx pgx.Tx, r *Request) (any, error) {
				runs.Add(1)
				if r.Key == "k-flaky" && failures.Add(-1) >= 0 {
					return nil, errors.New("connection reset by peer") // not permanent: transient
				}
				if _, err := tx.Exec(ctx, db.Q(`INSERT INTO {schema}.effects (tenant, message_id) VALUES ($1, $2)`), r.Tenant, r.Key); err != nil {
					return nil, err
				}
				if r.Key == "k-declined" {
					return nil, &exactlyonce.BusinessError{Status: http.StatusPaymentRequired, Body: map[string]string{"error": "card_declined"}}
				}
				return map[string]string{"charge": "ch_" + r.Key}, nil
			}, Status: 201},
		}}}
	})
	post := func(key string) resp {
		return do(t, nil, "POST", b.srv.URL+"/v1/charges", []byte(`{}`), http.Header{"Authorization": {"Bearer " + tokenA}, "Idempotency-Key": {key}})
	}

	first := post("k-declined")
	require.Equal(t, 402, first.status)
	require.Equal(t, `{"error":"card_declined"}`, string(first.body))
	again := post("k-declined")
	require.Equal(t, first.body, again.body)
	require.Equal(t, 402, again.status)
	require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	require.Equal(t, int32(1), runs.Load(), "a replay never runs the handler")
	require.Equal(t, 1, b.db.Count(t, "{schema}.effects WHERE message_id = 'k-declined'"), "what the handler wrote commits with its answer")

	r := post("k-flaky")
	require.Equal(t, 503, r.status)
	require.Equal(t, "unavailable", r.problemType(t))
	require.Equal(t, 0, b.db.Count(t, "{schema}.processed_messages WHERE message_id = 'k-flaky'"), "a transient failure is never stored")
	lookup := do(t, nil, "GET", b.srv.URL+"/v1/charges/k-flaky", nil, http.Header{"Authorization": {"Bearer " + tokenA}})
	require.Equal(t, 404, lookup.status, "nothing to look up after a transient failure")
	r = post("k-flaky")
	require.Equal(t, 201, r.status, "%s", r.body)
	require.Equal(t, `{"charge":"ch_k-flaky"}`, string(r.body))
	require.Equal(t, 1, b.db.Count(t, "{schema}.effects WHERE message_id = 'k-flaky'"))
}

// TestKeyLookup: GET {path}/{key} returns the stored answer of the caller's tenant with
// Idempotent-Replayed: true, 404 for another tenant's key or an unknown one, 409 while the
// key's request is in flight; it never runs an effect.
func TestKeyLookup(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	inEffect := make(chan struct{})
	b := setup(t, 8, func(db *pgtest.DB) Config {
		slow := Source{
			Name:        "slow",
			Path:        "/v1/slow",
			Verify:      Verify{Scheme: SchemeBearer, Tokens: map[string]string{tokenA: "a"}},
			Idempotency: &Idempotency{Lookup: true},
			Effect: Effect{Func: func(context.Context, pgx.Tx, *Request) (any, error) {
				close(inEffect)
				<-release
				return map[string]int{"n": 1}, nil
			}},
		}
		return Config{Sources: []Source{paymentsSource(t, db), slow}}
	})

	created := b.pay(t, tokenA, "POST", "", "k1", `{"amount": 7}`)
	require.Equal(t, 201, created.status, "%s", created.body)
	got := b.pay(t, tokenA, "GET", "/k1", "", "")
	require.Equal(t, 201, got.status)
	require.Equal(t, created.body, got.body)
	require.Equal(t, "true", got.header.Get("Idempotent-Replayed"))

	other := b.pay(t, tokenB, "GET", "/k1", "", "")
	require.Equal(t, 404, other.status, "another tenant's key is not found")
	require.Equal(t, "unknown-key", other.problemType(t))
	require.NotContains(t, string(other.body), `"amount"`)
	require.Equal(t, 404, b.pay(t, tokenA, "GET", "/k-never", "", "").status)
	require.Equal(t, 401, do(t, nil, "GET", b.srv.URL+"/v1/payments/k1", nil, nil).status)
	require.Equal(t, 1, b.effects(t), "lookups never run an effect")

	// A key is any printable ASCII: its item URL escapes it, '/' as %2F included.
	for _, key := range []string{"a/b", "a b?c#d%e", "/lead"} {
		created := b.pay(t, tokenA, "POST", "", key, `{"amount": 3}`)
		require.Equal(t, 201, created.status, "%s", created.body)
		got := b.pay(t, tokenA, "GET", "/"+url.PathEscape(key), "", "")
		require.Equal(t, 201, got.status, "key %q: %s", key, got.body)
		require.Equal(t, created.body, got.body)
	}
	require.Equal(t, 404, b.pay(t, tokenA, "GET", "/a/b", "", "").status, "an unescaped '/' is another path")

	// While the request runs, its key is in flight.
	done := make(chan resp)
	go func() {
		done <- do(t, nil, "POST", b.srv.URL+"/v1/slow", []byte(`{}`), http.Header{"Authorization": {"Bearer " + tokenA}, "Idempotency-Key": {"k-slow"}})
	}()
	<-inEffect
	r := do(t, nil, "GET", b.srv.URL+"/v1/slow/k-slow", nil, http.Header{"Authorization": {"Bearer " + tokenA}})
	require.Equal(t, 409, r.status)
	require.Equal(t, "in-flight", r.problemType(t))
	close(release)
	first := <-done
	require.Equal(t, 200, first.status)
	r = do(t, nil, "GET", b.srv.URL+"/v1/slow/k-slow", nil, http.Header{"Authorization": {"Bearer " + tokenA}})
	require.Equal(t, first.body, r.body)

	// Past its retention the key has no answer.
	b.db.Exec(t, b.db.Q(`UPDATE {schema}.processed_messages SET expires_at = now() - interval '1 second' WHERE message_id = 'k1'`))
	require.Equal(t, 404, b.pay(t, tokenA, "GET", "/k1", "", "").status)
}

// TestDeleteRetries: DELETE {path}/{id} runs its effect once per (tenant, id) and stores the
// answer: 204 when it deleted something, 404 when there was nothing; every retry, sequential
// or concurrent, gets the stored answer and never runs the statement again.
func TestDeleteRetries(t *testing.T) {
	t.Parallel()
	b := setup(t, 8, func(db *pgtest.DB) Config { return Config{Sources: []Source{paymentsSource(t, db)}} })
	b.db.Exec(t, b.db.Q(`INSERT INTO {schema}.payment_methods VALUES ('a', 'pm_1'), ('a', 'pm_2'), ('b', 'pm_2')`))

	first := b.pay(t, tokenA, "DELETE", "/pm_1", "", "")
	require.Equal(t, 204, first.status, "%s", first.body)
	require.Empty(t, first.body)
	// The row is gone, and it is back again: a retry still replays the stored 204 and does
	// not delete the new row.
	b.db.Exec(t, b.db.Q(`INSERT INTO {schema}.payment_methods VALUES ('a', 'pm_1')`))
	again := b.pay(t, tokenA, "DELETE", "/pm_1", "", "")
	require.Equal(t, 204, again.status)
	require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	require.Equal(t, 1, b.db.Count(t, "{schema}.payment_methods WHERE tenant = 'a' AND id = 'pm_1'"))

	missing := b.pay(t, tokenA, "DELETE", "/pm_404", "", "")
	require.Equal(t, 404, missing.status)
	require.Equal(t, "nothing-to-delete", missing.problemType(t))
	b.db.Exec(t, b.db.Q(`INSERT INTO {schema}.payment_methods VALUES ('a', 'pm_404')`))
	replayed := b.pay(t, tokenA, "DELETE", "/pm_404", "", "")
	require.Equal(t, 404, replayed.status, "the stored 404 is replayed")
	require.Equal(t, missing.body, replayed.body)
	require.Equal(t, "true", replayed.header.Get("Idempotent-Replayed"))

	// Concurrent retries of one delete: one runs, the others get its answer (or 409 while
	// it runs); tenant b's row of the same id is its own.
	var wg sync.WaitGroup
	codes := make([]int, 10)
	for i := range codes {
		wg.Go(func() {
			r := do(t, nil, "DELETE", b.srv.URL+"/v1/payments/pm_2", nil, http.Header{"Authorization": {"Bearer " + tokenA}, "Prefer": {"wait=10"}})
			codes[i] = r.status
		})
	}
	wg.Wait()
	for _, c := range codes {
		require.Equal(t, 204, c)
	}
	require.Equal(t, 0, b.db.Count(t, "{schema}.payment_methods WHERE tenant = 'a' AND id = 'pm_2'"))
	require.Equal(t, 1, b.db.Count(t, "{schema}.payment_methods WHERE tenant = 'b' AND id = 'pm_2'"))
	require.Equal(t, 204, b.pay(t, tokenB, "DELETE", "/pm_2", "", "").status)
	require.Equal(t, 0, b.db.Count(t, "{schema}.payment_methods WHERE id = 'pm_2'"))

	// A DELETE's id is not a POST's key: the two never meet.
	require.Equal(t, 201, b.pay(t, tokenA, "POST", "", "pm_1", `{"amount": 1}`).status)

	// Without delete: 405, and Allow says what is served.
	r := do(t, nil, "PATCH", b.srv.URL+"/v1/payments/pm_1", nil, http.Header{"Authorization": {"Bearer " + tokenA}})
	require.Equal(t, 405, r.status)
	require.Equal(t, "PUT, GET, DELETE", r.header.Get("Allow"))
}

package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/delivery"
	"github.com/idemd/idemd/internal/kafkatest"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/internal/proctest"
)

// TestHTTPSinkEndToEnd: a source with publish.http (and no topic). A signed webhook in, the
// event is POSTed to the endpoint, which fails the first attempt; the retry carries the same
// Idempotency-Key and a Standard Webhooks signature that verifies; the same webhook again
// delivers nothing more.
func TestHTTPSinkEndToEnd(t *testing.T) {
	t.Parallel()
	const sinkSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	type attempt struct{ key, id, ts, sig, body string }
	var (
		mu       sync.Mutex
		attempts []attempt
		arrived  = make(chan struct{}, 10) // one value per attempt, after it is recorded
	)
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		defer func() { arrived <- struct{}{} }()
		attempts = append(attempts, attempt{r.Header.Get("Idempotency-Key"), r.Header.Get("webhook-id"),
			r.Header.Get("webhook-timestamp"), r.Header.Get("webhook-signature"), string(b)})
		if len(attempts) == 1 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer sink.Close()

	schema := testSchema(t)
	pool := pgtest.Pool(t, 4)
	_, err := pool.Exec(context.Background(), fmt.Sprintf("CREATE SCHEMA %[1]s; CREATE TABLE %[1]s.payments (event_id text PRIMARY KEY)", schema))
	require.NoError(t, err)
	file := filepath.Join(t.TempDir(), "idemd.yaml")
	require.NoError(t, os.WriteFile(file, []byte(fmt.Sprintf(`sources:
  - name: stripe
    verify: {scheme: stripe, secrets_env: [E2E_STRIPE_SECRET]}
    effect: {sql: "INSERT INTO %s.payments (event_id) VALUES (@message_id)"}
    publish: {http: {url: %q, secret_env: E2E_SINK_SECRET, timeout: 5s}}
`, schema, sink.URL+"/hooks")), 0o600))
	httpAddr, adminAddr := proctest.FreeAddr(t), proctest.FreeAddr(t)
	p := startIdemd(t, map[string]string{
		"IDEMD_DATABASE_URL": pgtest.URL(), "IDEMD_KAFKA_BROKERS": strings.Join(kafkatest.Brokers(t), ","),
		"IDEMD_PIPELINES_FILE": file, "IDEMD_DB_SCHEMA": schema, "IDEMD_DB_MAX_CONNS": "6",
		"IDEMD_HTTP_ADDR": httpAddr, "IDEMD_ADMIN_ADDR": adminAddr, "IDEMD_SHUTDOWN_TIMEOUT": "10s",
		"E2E_STRIPE_SECRET": stripeSecret, "E2E_SINK_SECRET": sinkSecret,
	}, "serve")
	waitReady(t, p, adminAddr)

	send := func() int {
		body := `{"id":"evt_sink_1","object":"event","type":"charge.succeeded","data":{"object":{"id":"ch_1"}}}`
		resp, err := http.DefaultClient.Do(stripeRequest(t, "http://"+httpAddr+"/webhooks/stripe", stripeSecret, []byte(body)))
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusOK, send())
	for i := range 2 {
		select {
		case <-arrived:
		case <-time.After(30 * time.Second):
			t.Fatalf("attempt %d did not arrive", i+1)
		}
	}
	require.Equal(t, http.StatusOK, send(), "the duplicate is answered 2xx")

	// HTTP targets only: no relay leader is needed (alert IdemdNoRelayLeader stays silent).
	resp, err := http.Get("http://" + adminAddr + "/metrics")
	require.NoError(t, err)
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Contains(t, string(metrics), "\nidemd_relay_expected 0\n")

	key, err := delivery.ParseSecret(sinkSecret)
	require.NoError(t, err)
	mu.Lock()
	got := append([]attempt(nil), attempts...)
	mu.Unlock()
	require.Len(t, got, 2, "one failed attempt, one accepted delivery, nothing for the duplicate")
	for _, a := range got {
		require.Equal(t, got[0].key, a.key, "every attempt carries the same Idempotency-Key")
		require.Equal(t, a.key, a.id, "webhook-id is the operation id")
		require.True(t, delivery.Verify(key, a.id, a.ts, []byte(a.body), a.sig), "the signature verifies")
		require.Contains(t, a.body, "evt_sink_1")
	}
	code, _ := stopIdemd(t, p, 10*time.Second)
	require.Equal(t, 0, code)
	require.NotContains(t, p.Stderr(), sinkSecret)
}

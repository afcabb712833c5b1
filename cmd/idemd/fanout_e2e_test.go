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
	"github.com/idemd/idemd/outbox"
)

// TestFanOutEndToEnd: one signed webhook, three targets (SPEC 2.3b): a Kafka topic, an HTTP
// endpoint whose filter lets only invoices through, and a flaky HTTP endpoint behind a
// circuit breaker. Each matching target gets exactly one event, with its own stable
// operation id (outbox.TargetOperationID of pipeline, message id and target); the filtered
// endpoint gets nothing; the flaky one fails twice, its breaker opens, the probe after the
// cool-down fails and opens it again, the next probe succeeds and closes it. The same
// webhook again publishes nothing more.
func TestFanOutEndToEnd(t *testing.T) {
	t.Parallel()
	const (
		sinkSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
		coolDown   = time.Second
	)
	type attempt struct {
		key, sig, ts, body string
		at                 time.Time
		status             int
	}
	var (
		mu        sync.Mutex
		invoices  []attempt
		erp       []attempt
		delivered = make(chan struct{}, 1)
	)
	filtered := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		invoices = append(invoices, attempt{key: r.Header.Get("Idempotency-Key")})
		w.WriteHeader(http.StatusNoContent)
	}))
	defer filtered.Close()
	flaky := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		a := attempt{key: r.Header.Get("Idempotency-Key"), sig: r.Header.Get("webhook-signature"),
			ts: r.Header.Get("webhook-timestamp"), body: string(b), at: time.Now(), status: http.StatusServiceUnavailable}
		if len(erp) >= 3 {
			a.status = http.StatusOK
			select {
			case delivered <- struct{}{}:
			default:
			}
		}
		erp = append(erp, a)
		w.WriteHeader(a.status)
	}))
	defer flaky.Close()

	schema := testSchema(t)
	topic := kafkatest.Name(t, "billing")
	kafkatest.CreateTopic(t, topic, 1)
	file := filepath.Join(t.TempDir(), "idemd.yaml")
	require.NoError(t, os.WriteFile(file, []byte(fmt.Sprintf(`sources:
  - name: billing
    verify: {scheme: stripe, secrets_env: [E2E_STRIPE_SECRET]}
    publish:
      - {name: all, topic: %s, key: {json: /data/object/id}}
      - name: invoices
        http: {url: %q, secret_env: E2E_SINK_SECRET}
        filter: {type: ["invoice.*"]}
      - name: erp
        http:
          url: %q
          secret_env: E2E_SINK_SECRET
          breaker: {failures: 2, cool_down: %s}
          retry: {min_backoff: 10ms, max_backoff: 20ms}
        filter: {type: ["charge.*", "invoice.*"]}
`, topic, filtered.URL+"/hooks", flaky.URL+"/erp", coolDown)), 0o600))
	httpAddr, adminAddr := proctest.FreeAddr(t), proctest.FreeAddr(t)
	p := startIdemd(t, map[string]string{
		"IDEMD_DATABASE_URL": pgtest.URL(), "IDEMD_KAFKA_BROKERS": strings.Join(kafkatest.Brokers(t), ","),
		"IDEMD_PIPELINES_FILE": file, "IDEMD_DB_SCHEMA": schema, "IDEMD_DB_MAX_CONNS": "6",
		"IDEMD_HTTP_ADDR": httpAddr, "IDEMD_ADMIN_ADDR": adminAddr, "IDEMD_SHUTDOWN_TIMEOUT": "10s",
		// Published rows are kept, so that the outbox rows can be counted below.
		"IDEMD_OUTBOX_KEEP_PUBLISHED": "true",
		"E2E_STRIPE_SECRET":           stripeSecret, "E2E_SINK_SECRET": sinkSecret,
	}, "serve")
	waitReady(t, p, adminAddr)

	body := `{"id":"evt_fan_1","object":"event","type":"charge.succeeded","data":{"object":{"id":"ch_1"}}}`
	send := func() string {
		resp, err := http.DefaultClient.Do(stripeRequest(t, "http://"+httpAddr+"/webhooks/billing", stripeSecret, []byte(body)))
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
		return string(b)
	}
	require.Contains(t, send(), `"processed"`)
	select {
	case <-delivered:
	case <-time.After(60 * time.Second):
		t.Fatal("the flaky endpoint never accepted the event")
	}

	// Kafka: one record, with the "all" target's operation id.
	recs := kafkatest.ReadAll(t, topic, 1, 30*time.Second)
	require.Len(t, recs, 1)
	allOp := outbox.TargetOperationID("billing", "evt_fan_1", "all").String()
	require.Equal(t, allOp, kafkatest.Header(recs[0], outbox.HeaderOperationID))
	require.Equal(t, "ch_1", string(recs[0].Key))

	// The flaky endpoint: 2 failures open the breaker, a failed probe after the cool-down
	// opens it again, the next probe is accepted; every attempt is the same event, with the
	// "erp" target's operation id, signed.
	key, err := delivery.ParseSecret(sinkSecret)
	require.NoError(t, err)
	mu.Lock()
	got := append([]attempt(nil), erp...)
	filteredGot := len(invoices)
	mu.Unlock()
	require.Len(t, got, 4)
	erpOp := outbox.TargetOperationID("billing", "evt_fan_1", "erp").String()
	require.NotEqual(t, allOp, erpOp)
	for _, a := range got {
		require.Equal(t, erpOp, a.key, "one stable operation id on every attempt")
		require.True(t, delivery.Verify(key, a.key, a.ts, []byte(a.body), a.sig))
	}
	require.Equal(t, []int{503, 503, 503, 200}, []int{got[0].status, got[1].status, got[2].status, got[3].status})
	require.GreaterOrEqual(t, got[2].at.Sub(got[1].at), coolDown, "open: nothing sent during the cool-down")
	require.GreaterOrEqual(t, got[3].at.Sub(got[2].at), coolDown, "the failed probe opened it again")
	require.Zero(t, filteredGot, "the invoices endpoint is filtered out by type")

	// The same webhook again: a duplicate, nothing more published.
	require.Contains(t, send(), `"duplicate"`)
	pool := pgtest.Pool(t, 2)
	var outboxRows, deliveries int
	require.NoError(t, pool.QueryRow(context.Background(), fmt.Sprintf(
		`SELECT (SELECT count(*) FROM %[1]s.outbox) + (SELECT count(*) FROM %[1]s.outbox_published), (SELECT count(*) FROM %[1]s.http_deliveries)`, schema)).Scan(&outboxRows, &deliveries))
	require.Equal(t, 1, outboxRows)
	require.Equal(t, 1, deliveries, "one delivery: the erp endpoint's")

	resp, err := http.Get("http://" + adminAddr + "/metrics")
	require.NoError(t, err)
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Contains(t, string(metrics), `idemd_http_endpoint_breaker_transitions_total{endpoint="billing:erp",state="open"} 2`)
	require.Contains(t, string(metrics), `idemd_http_endpoint_breaker_transitions_total{endpoint="billing:erp",state="closed"} 1`)
	require.Contains(t, string(metrics), `idemd_http_endpoint_breaker_open{endpoint="billing:erp"} 0`)

	code, _ := stopIdemd(t, p, 10*time.Second)
	require.Equal(t, 0, code)
	require.NotContains(t, p.Stderr(), sinkSecret)
}

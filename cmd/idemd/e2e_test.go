package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/kafkatest"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/internal/proctest"
	"github.com/idemd/idemd/outbox"
)

const stripeSecret = "whsec_e2e_test_secret"

// stack is a serve process on its own schema, topics and ports.
type stack struct {
	p         *proctest.Proc
	pool      *pgxpool.Pool
	schema    string
	topic     string
	httpAddr  string
	adminAddr string
	timeout   time.Duration
}

// serveStack writes a pipelines file — a stripe source that records payments and publishes
// them, and a subscription that consumes them into a ledger — and runs `idemd serve` on it.
func serveStack(t *testing.T, shutdownTimeout time.Duration) *stack {
	t.Helper()
	s := &stack{schema: testSchema(t), topic: kafkatest.Name(t, "payments"), timeout: shutdownTimeout}
	s.httpAddr, s.adminAddr = proctest.FreeAddr(t), proctest.FreeAddr(t)
	s.pool = pgtest.Pool(t, 4)
	ctx := context.Background()
	_, err := s.pool.Exec(ctx, fmt.Sprintf(`CREATE SCHEMA %[1]s;
CREATE TABLE %[1]s.payments (event_id text PRIMARY KEY, amount bigint);
CREATE TABLE %[1]s.ledger (event_id text PRIMARY KEY, payment_id text, body jsonb)`, s.schema))
	require.NoError(t, err)
	kafkatest.CreateTopic(t, s.topic, 3)

	file := filepath.Join(t.TempDir(), "idemd.yaml")
	require.NoError(t, os.WriteFile(file, []byte(fmt.Sprintf(`sources:
  - name: stripe
    verify: {scheme: stripe, secrets_env: [E2E_STRIPE_SECRET]}
    effect:
      sql: "INSERT INTO %[1]s.payments (event_id, amount) VALUES (@message_id, (@payload::jsonb #>> '{data,object,amount}')::bigint)"
    publish: {topic: %[2]s, key: {json: /data/object/id}}
subscriptions:
  - name: ledger
    topics: [%[2]s]
    group: %[3]s
    effect: {sql: "INSERT INTO %[1]s.ledger (event_id, payment_id, body) VALUES (@message_id, @payload::jsonb #>> '{data,object,id}', @payload::jsonb)"}
`, s.schema, s.topic, kafkatest.Group(t))), 0o600))

	s.p = startIdemd(t, map[string]string{
		"IDEMD_DATABASE_URL":     pgtest.URL(),
		"IDEMD_KAFKA_BROKERS":    strings.Join(kafkatest.Brokers(t), ","),
		"IDEMD_PIPELINES_FILE":   file,
		"IDEMD_DB_SCHEMA":        s.schema,
		"IDEMD_DB_MAX_CONNS":     "8",
		"IDEMD_HTTP_ADDR":        s.httpAddr,
		"IDEMD_ADMIN_ADDR":       s.adminAddr,
		"IDEMD_SHUTDOWN_TIMEOUT": shutdownTimeout.String(),
		"IDEMD_LOG_LEVEL":        "info",
		"E2E_STRIPE_SECRET":      stripeSecret,
	}, "serve")
	waitReady(t, s.p, s.adminAddr)
	return s
}

func (s *stack) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	require.NoError(t, s.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+s.schema+"."+table).Scan(&n))
	return n
}

// waitCount waits until table has want rows: the effect happens in another process, whose
// commits to the table wake the wait (pgtest.Watch).
func (s *stack) waitCount(t *testing.T, table string, want int) {
	t.Helper()
	pgtest.Watch(t, s.schema+"."+table).Until(t, 30*time.Second, fmt.Sprintf("%d rows in %s", want, table),
		func() bool { return s.count(t, table) >= want })
	require.Equal(t, want, s.count(t, table), table)
}

func (s *stack) webhook(t *testing.T, id string) (int, string) {
	t.Helper()
	body := fmt.Sprintf(`{"id":%q,"object":"event","type":"payment_intent.succeeded","pending_webhooks":1,"data":{"object":{"id":"pi_%s","amount":1200}}}`, id, id)
	resp, err := http.DefaultClient.Do(stripeRequest(t, "http://"+s.httpAddr+"/webhooks/stripe", stripeSecret, []byte(body)))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestEndToEnd: a signed webhook in, exactly one record on the source's topic, the
// subscription consumes it, exactly one effect row; the same webhook again changes nothing.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	s := serveStack(t, 20*time.Second)

	code, body := s.webhook(t, "evt_e2e_1")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `"processed"`)
	s.waitCount(t, "ledger", 1)
	require.Equal(t, 1, s.count(t, "payments"))

	recs := kafkatest.ReadAll(t, s.topic, 2, 2*time.Second)
	require.Len(t, recs, 1, "exactly one record on the source's topic")
	require.Equal(t, "pi_evt_e2e_1", string(recs[0].Key))
	require.Equal(t, "stripe", kafkatest.Header(recs[0], outbox.HeaderPipeline))
	require.Equal(t, "evt_e2e_1", kafkatest.Header(recs[0], outbox.HeaderCausationID))
	var ledgerID string
	require.NoError(t, s.pool.QueryRow(context.Background(), "SELECT event_id FROM "+s.schema+".ledger").Scan(&ledgerID))
	require.Equal(t, kafkatest.Header(recs[0], outbox.HeaderOperationID), ledgerID, "the subscription dedupes on the operation id")

	// The same webhook again (Stripe changes pending_webhooks between retries): nothing.
	code, body = s.webhook(t, "evt_e2e_1")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `"duplicate"`)
	require.Equal(t, 1, s.count(t, "payments"))
	require.Zero(t, s.count(t, "outbox WHERE published_at IS NULL"), "no event waits")
	require.Len(t, kafkatest.ReadAll(t, s.topic, 2, time.Second), 1, "and none was published again")
	require.Equal(t, 1, s.count(t, "ledger"))

	// Metrics are served with the pipeline's series.
	resp, err := http.Get("http://" + s.adminAddr + "/metrics")
	require.NoError(t, err)
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Contains(t, string(metrics), `idemd_messages_processed_total{pipeline="stripe"} 1`)
	require.Contains(t, string(metrics), `idemd_messages_duplicate_total{pipeline="stripe"} 1`)
	require.Contains(t, string(metrics), "\nidemd_relay_expected 1\n", "the source publishes to Kafka: a relay must lead")

	code, took := stopIdemd(t, s.p, s.timeout)
	require.Equal(t, 0, code)
	require.Less(t, took, s.timeout)
	require.NotContains(t, s.p.Stderr(), stripeSecret, "no secret in the logs")
}

package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/kafkatest"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/internal/proctest"
	"github.com/idemd/idemd/outbox"
)

// TestShutdownUnderLoad: SIGTERM while clients keep sending. Every request answered 2xx has
// its effect and its outbox row published (the relay flushed), the exit is clean and within
// IDEMD_SHUTDOWN_TIMEOUT.
func TestShutdownUnderLoad(t *testing.T) {
	t.Parallel()
	const timeout = 15 * time.Second
	s := serveStack(t, timeout)

	var (
		mu      sync.Mutex
		acked   []string
		sent    atomic.Int64
		stop    = make(chan struct{})
		wg      sync.WaitGroup
		enough  = make(chan struct{})
		enoughO sync.Once
	)
	client := &http.Client{Timeout: 10 * time.Second}
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("evt_load_%d_%d", w, i)
				body := fmt.Sprintf(`{"id":%q,"object":"event","data":{"object":{"id":"pi_%d","amount":%d}}}`, id, w, i)
				resp, err := client.Do(stripeRequest(t, "http://"+s.httpAddr+"/webhooks/stripe", stripeSecret, []byte(body)))
				if err != nil {
					continue // refused once the listener closed: the sender retries later
				}
				resp.Body.Close()
				if resp.StatusCode/100 == 2 {
					mu.Lock()
					acked = append(acked, id)
					mu.Unlock()
				}
				if sent.Add(1) == 200 {
					enoughO.Do(func() { close(enough) })
				}
			}
		}()
	}
	select {
	case <-enough:
	case <-time.After(60 * time.Second):
		t.Fatal("the load did not get going")
	}

	code, took := stopIdemd(t, s.p, timeout)
	close(stop)
	wg.Wait()
	require.Equal(t, 0, code, "clean exit")
	require.Less(t, took, timeout)
	require.NotEmpty(t, acked)

	ctx := context.Background()
	var missing int
	require.NoError(t, s.pool.QueryRow(ctx, "SELECT count(*) FROM unnest($1::text[]) AS a(id) WHERE NOT EXISTS (SELECT 1 FROM "+s.schema+".payments p WHERE p.event_id = a.id)", acked).Scan(&missing))
	require.Zero(t, missing, "every 2xx has its effect")
	var unpublished int
	require.NoError(t, s.pool.QueryRow(ctx, "SELECT count(*) FROM "+s.schema+".outbox WHERE published_at IS NULL").Scan(&unpublished))
	require.Zero(t, unpublished, "the relay flushed the outbox before exiting")
	// The relay deleted what it published: every effect's event is on the topic.
	payments := s.count(t, "payments")
	published := map[string]bool{}
	for _, r := range kafkatest.ReadAtLeastFrom(t, kafkatest.Brokers(t), s.topic, payments, 30*time.Second, 300*time.Millisecond) {
		published[kafkatest.Header(r, outbox.HeaderCausationID)] = true
	}
	require.Len(t, published, payments, "every effect's event reached the topic")
	t.Logf("%d requests acknowledged; exit after %s", len(acked), took)
}

// TestShutdownBoundedBySlowEffect: an effect that outlasts IDEMD_SHUTDOWN_TIMEOUT does not
// hold the exit. The process exits within the timeout (non-zero: the drain overran) and the
// request in flight is never answered 2xx. Its transaction may still commit after the exit
// (its COMMIT can already be in PostgreSQL's hands): unacknowledged, it is the crash between
// commit and acknowledgement that the fault suite covers, and the sender's retry is a
// duplicate.
func TestShutdownBoundedBySlowEffect(t *testing.T) {
	t.Parallel()
	const (
		timeout = 2 * time.Second
		sleep   = 8 // seconds of the effect
	)
	schema, httpAddr, adminAddr := testSchema(t), proctest.FreeAddr(t), proctest.FreeAddr(t)
	pool := pgtest.Pool(t, 2)
	ctx := context.Background()
	_, err := pool.Exec(ctx, fmt.Sprintf(`CREATE SCHEMA %[1]s; CREATE TABLE %[1]s.payments (event_id text PRIMARY KEY)`, schema))
	require.NoError(t, err)
	file := filepath.Join(t.TempDir(), "idemd.yaml")
	require.NoError(t, os.WriteFile(file, fmt.Appendf(nil, `sources:
  - name: slow
    verify: {scheme: stripe, secrets_env: [E2E_STRIPE_SECRET]}
    effect:
      sql: "INSERT INTO %s.payments (event_id) SELECT @message_id FROM pg_sleep(%d)"
`, schema, sleep), 0o600))
	p := startIdemd(t, map[string]string{
		"IDEMD_DATABASE_URL":     pgtest.URL(),
		"IDEMD_PIPELINES_FILE":   file,
		"IDEMD_ROLES":            "receiver",
		"IDEMD_DB_SCHEMA":        schema,
		"IDEMD_DB_MAX_CONNS":     "4",
		"IDEMD_HTTP_ADDR":        httpAddr,
		"IDEMD_ADMIN_ADDR":       adminAddr,
		"IDEMD_SHUTDOWN_TIMEOUT": timeout.String(),
		"E2E_STRIPE_SECRET":      stripeSecret,
	}, "serve")
	waitReady(t, p, adminAddr)

	answered := make(chan int, 1)
	go func() {
		resp, err := (&http.Client{Timeout: 2 * sleep * time.Second}).Do(
			stripeRequest(t, "http://"+httpAddr+"/webhooks/slow", stripeSecret, []byte(`{"id":"evt_slow","object":"event"}`)))
		if err != nil {
			answered <- 0 // the connection closed without an answer: the sender retries
			return
		}
		resp.Body.Close()
		answered <- resp.StatusCode
	}()
	sleeping := func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep%' AND query LIKE '%'||$1||'%' AND pid <> pg_backend_pid()", schema).Scan(&n))
		return n > 0
	}
	require.Eventually(t, sleeping, 10*time.Second, 20*time.Millisecond, "the effect is running")

	code, took := stopIdemd(t, p, timeout)
	require.Equal(t, 1, code, "the drain overran: exit 1\n%s", p.Stderr())
	require.Less(t, took, timeout+time.Second, "exit within IDEMD_SHUTDOWN_TIMEOUT, not after the effect (%d s)", sleep)
	require.Contains(t, p.Stderr(), "shutdown did not finish within IDEMD_SHUTDOWN_TIMEOUT")
	require.NotEqual(t, 2, <-answered/100, "no 2xx for the request whose transaction the exit abandoned")
}

package receiver

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
)

// crashConfig is the receiver of both the crashing helper and the test that retries.
func crashConfig(db *pgtest.DB) Config {
	return Config{Schema: db.Schema, Lease: time.Second, Sources: []Source{stripeSource(db), ordersSource(db)}}
}

// TestHelperProcess serves a receiver that exits at its first COMMIT: the process dies after
// the claim (and the API reservation), before the effect's commit.
func TestHelperProcess(t *testing.T) {
	schema := os.Getenv("IDEMD_RECEIVER_CRASH_SCHEMA")
	if schema == "" {
		t.Skip("helper process for the crash tests")
	}
	pool := pgtest.Pool(t, 4)
	cfg := crashConfig(&pgtest.DB{Pool: pool, Schema: schema})
	cfg.BeforeCommit = func([]string) { os.Exit(3) }
	r, err := New(pool, &cfg)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	os.Stdout.WriteString(ln.Addr().String() + "\n")
	_ = http.Serve(ln, r)
}

func TestCrashMidRequest(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWithOptions(t, pgtest.Options{MaxConns: 4})
	db.Exec(t, db.Q(`CREATE TABLE {schema}.effects (
		id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, message_id text, tenant text,
		body jsonb, amount bigint CHECK (amount >= 0))`))

	crash := func(send func(url string) error) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
		cmd.Env = append(os.Environ(), "IDEMD_RECEIVER_CRASH_SCHEMA="+db.Schema)
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill() })
		addr, err := bufio.NewReader(out).ReadString('\n')
		require.NoError(t, err)
		require.Error(t, send("http://"+addr[:len(addr)-1]), "the helper dies before answering")
		var exit *exec.ExitError
		require.True(t, errors.As(cmd.Wait(), &exit))
		require.Equal(t, 3, exit.ExitCode())
	}
	post := func(url, path string, body []byte, h http.Header) error {
		req, _ := http.NewRequestWithContext(context.Background(), "POST", url+path, bytesReader(body))
		req.Header = h
		res, err := http.DefaultClient.Do(req)
		if err == nil {
			res.Body.Close()
		}
		return err
	}
	body := stripeEvent("evt_crash", 10, "")
	webhook := func(url string) error {
		return post(url, "/webhooks/stripe", body, http.Header{"Stripe-Signature": {stripeSig(testSecret, time.Now(), body)}})
	}
	order := func(url string) error {
		return post(url, "/v1/orders", []byte(`{"amount":1}`), http.Header{"Authorization": {"Bearer token-a-0123456789"}, "Idempotency-Key": {"crash-key"}})
	}
	crash(webhook)
	crash(order)
	require.Equal(t, 0, db.Count(t, "{schema}.effects"))
	require.Equal(t, 1, db.Count(t, "{schema}.processed_messages WHERE status = 'in_flight'"), "the API reservation survived")

	cfg := crashConfig(db)
	r, err := New(db.Pool, &cfg)
	require.NoError(t, err)
	t.Cleanup(r.Close)
	b := &bundle{db: db, rcv: r}
	srv := newServer(t, r)
	b.srv = srv
	res := b.stripe(t, body)
	require.Equal(t, 200, res.status)
	require.Equal(t, "processed", res.json(t)["status"])
	// The abandoned reservation is taken over after its lease.
	res = b.order(t, "token-a-0123456789", "crash-key", `{"amount":1}`, "Prefer", "wait=10")
	require.Equal(t, 201, res.status, "%s", res.body)
	require.Equal(t, 2, b.effects(t))
	require.Equal(t, 200, b.stripe(t, body).status)
	require.Equal(t, 2, b.effects(t))
}

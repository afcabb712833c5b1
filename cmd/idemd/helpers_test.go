package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/internal/proctest"
	"github.com/idemd/idemd/migrations"
)

func TestMain(m *testing.M) { proctest.Main(m) }

// startIdemd runs idemd with args and vars; it is killed at cleanup if still running.
func startIdemd(t *testing.T, vars map[string]string, args ...string) *proctest.Proc {
	t.Helper()
	p := proctest.Start(t, vars, args...)
	t.Cleanup(func() {
		p.Kill(t)
		if t.Failed() {
			t.Logf("idemd stdout:\n%s\nidemd stderr:\n%s", p.Stdout(), p.Stderr())
		}
	})
	return p
}

// runIdemd runs idemd to completion and returns its exit code, stdout and stderr.
func runIdemd(t *testing.T, vars map[string]string, args ...string) (int, string, string) {
	t.Helper()
	p := startIdemd(t, vars, args...)
	if !p.Wait(60 * time.Second) {
		t.Fatalf("idemd %v did not exit", args)
	}
	return p.ExitCode(), p.Stdout(), p.Stderr()
}

// stopIdemd sends SIGTERM and waits for the exit; it returns the exit code and how long it took.
func stopIdemd(t *testing.T, p *proctest.Proc, within time.Duration) (int, time.Duration) {
	t.Helper()
	start := time.Now()
	require.NoError(t, p.Signal(syscall.SIGTERM))
	if !p.Wait(within + 10*time.Second) {
		t.Fatalf("idemd did not exit within %s of SIGTERM", within)
	}
	return p.ExitCode(), time.Since(start)
}

// waitReady polls /readyz (an external process gives no other signal) until 200.
func waitReady(t *testing.T, p *proctest.Proc, adminAddr string) {
	t.Helper()
	if err := p.WaitReady(adminAddr, 60*time.Second); err != nil {
		t.Fatalf("idemd %v", err)
	}
}

// testSchema returns a fresh schema name for IDEMD_DB_SCHEMA, and drops it (and its _dev
// sibling) at cleanup.
func testSchema(t *testing.T) string {
	t.Helper()
	schema := pgtest.SchemaName(t)
	pool := pgtest.Pool(t, 2)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, s := range []string{schema, schema + "_dev"} {
			_, _ = pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{s}.Sanitize()+" CASCADE")
		}
	})
	return schema
}

// migratedSchema is testSchema with idemd's migrations applied, and a pool on the database.
func migratedSchema(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	schema := testSchema(t)
	pool := pgtest.Pool(t, 2)
	require.NoError(t, migrations.Apply(context.Background(), pool, &migrations.Config{Schema: schema}))
	return schema, pool
}

// stripeRequest is a webhook signed the way Stripe signs it.
func stripeRequest(t *testing.T, url, secret string, body []byte) *http.Request {
	t.Helper()
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(ts + "." + string(body)))
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Stripe-Signature", "t="+ts+",v1="+hex.EncodeToString(mac.Sum(nil)))
	return req
}

// lines of s that contain sub.
func linesWith(s, sub string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return out
}

package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/admin"
	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/migrations"
)

// `idemd dlq list|show|replay` with filters, a dry run, a progress line and a note when a
// list is cut; `idemd inspect` tells a message's story. Sender-controlled text is escaped.
func TestDLQFiltersBulkReplayAndInspect(t *testing.T) {
	t.Parallel()
	schema := testSchema(t)
	pool := pgtest.Pool(t, 2)
	ctx := context.Background()
	require.NoError(t, migrations.Apply(ctx, pool, &migrations.Config{Schema: schema}))
	_, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %[1]s.payments (event_id text PRIMARY KEY, amount bigint)`, schema))
	require.NoError(t, err)
	file := filepath.Join(t.TempDir(), "idemd.yaml")
	require.NoError(t, os.WriteFile(file, []byte(fmt.Sprintf(`sources:
  - name: stripe
    verify: {scheme: stripe, secrets_env: [DLQ_STRIPE_SECRET]}
    effect:
      sql: "INSERT INTO %[1]s.payments (event_id, amount) VALUES (@message_id, (@payload::jsonb ->> 'amount')::bigint)"
`, schema)), 0o600))

	letters := deadletter.New(schema)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for i := 0; i < 5; i++ {
			reason := "boom"
			if i == 4 {
				reason = "other \x1b[31mred\x1b[0m"
			}
			if _, err := letters.WriteTx(ctx, tx, &deadletter.Letter{
				Pipeline: "stripe", Origin: deadletter.Origin{Door: deadletter.DoorHTTP}, Scope: "stripe", MessageID: fmt.Sprintf("evt_%d", i), Payload: []byte(fmt.Sprintf(`{"amount":%d}`, i)),
				Headers:  map[string][]string{"Stripe-Signature": {"t=1,v1=abc"}},
				Metadata: map[string]any{"method": "POST", "path": "/webhooks/stripe"},
				Reason:   reason, Attempts: 1,
			}); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `UPDATE `+schema+`.dead_letters SET created_at = '2026-03-01T12:00:00Z'::timestamptz + (id - 1) * interval '10 minutes'`)
		return err
	}))
	vars := map[string]string{
		"IDEMD_DATABASE_URL": pgtest.URL(), "IDEMD_DB_SCHEMA": schema, "IDEMD_PIPELINES_FILE": file,
		"DLQ_STRIPE_SECRET": "whsec_dlq_0123456789abcdef", "USER": "ops",
	}

	code, out, errOut := runIdemd(t, vars, "dlq", "list", "-limit", "2")
	require.Equal(t, exitOK, code, errOut)
	require.Len(t, strings.Split(strings.TrimSpace(out), "\n"), 3, out)
	require.Contains(t, errOut, "the list is cut at -limit 2; more letters match: add -after 2")

	code, out, _ = runIdemd(t, vars, "dlq", "list", "-since", "2026-03-01T12:10:00Z", "-until", "2026-03-01T12:30:00Z")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "evt_1")
	require.Contains(t, out, "evt_2")
	require.NotContains(t, out, "evt_0")
	require.NotContains(t, out, "evt_3")

	code, out, _ = runIdemd(t, vars, "dlq", "list", "-reason", "OTHER")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "evt_4")
	require.NotContains(t, out, "\x1b", "terminal escapes are shown, not obeyed")
	require.Contains(t, out, `\x1b[31mred`)

	code, _, errOut = runIdemd(t, vars, "dlq", "list", "-since", "yesterday")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "-since")

	code, out, _ = runIdemd(t, vars, "dlq", "show", "1")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "origin:     http")
	require.Contains(t, out, `{"amount":0}`)
	require.Contains(t, out, "Stripe-Signature: [redacted]")

	code, _, errOut = runIdemd(t, vars, "dlq", "replay")
	require.Equal(t, exitUsage, code, "no id and no filter: refused without -all")
	require.Contains(t, errOut, "-all")

	code, out, _ = runIdemd(t, vars, "dlq", "replay", "-reason", "boom", "-dry-run")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "dry run: 4 letters match")
	require.Equal(t, 0, count(t, pool, schema, "payments"))

	code, out, errOut = runIdemd(t, vars, "dlq", "replay", "-reason", "boom")
	require.Equal(t, exitOK, code, out+errOut)
	require.Contains(t, out, "4 matched, 4 replayed, 0 skipped (replayed by someone else meanwhile), 0 failed")
	require.Contains(t, errOut, "progress: 4/4 letters")
	require.Equal(t, 4, count(t, pool, schema, "payments"))
	require.Equal(t, 4, count(t, pool, schema, "admin_audit WHERE actor = 'cli:ops' AND outcome = 'done'"))

	code, out, _ = runIdemd(t, vars, "dlq", "replay", "-all")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "1 matched, 1 replayed", "only the letter not yet replayed")
	require.Equal(t, 5, count(t, pool, schema, "payments"))

	code, out, _ = runIdemd(t, vars, "dlq", "replay", "-all", "-dry-run")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "dry run: 0 letters match")

	// inspect: a record with its dead letter, now replayed.
	_, err = pool.Exec(ctx, `INSERT INTO `+schema+`.processed_messages (scope, message_id, fingerprint, status, expires_at)
VALUES ('stripe', 'evt_1', '\xab', 'dead', now() + interval '7 days')`)
	require.NoError(t, err)
	code, out, errOut = runIdemd(t, vars, "inspect", "stripe", "evt_1")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "message evt_1 of pipeline stripe")
	require.Contains(t, out, "effect:      dead_lettered after 1 attempts: boom")
	require.Contains(t, out, "dead letters (1):")
	code, _, errOut = runIdemd(t, vars, "inspect", "stripe", "nope")
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "no record of message")
}

func count(t *testing.T, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, schema, from string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM "+schema+"."+from).Scan(&n))
	return n
}

// inspect's story says "not replayed" for a letter never replayed, and names the other
// tenants holding the id.
func TestPrintStory(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	st := &admin.Story{
		Message: admin.Message{Pipeline: "orders", Tenant: "bob", MessageID: "k1", Status: "dead_lettered", ReceivedAt: at, ExpiresAt: at},
		Effect:  admin.Effect{Outcome: "dead_lettered"},
		DeadLetters: []admin.DeadLetterBrief{
			{ID: 25, Origin: "delivery", Reason: "refused: 400 Bad Request"},
			{ID: 19, Origin: "http", Reason: "boom", ReplayedAt: &at},
		},
		OtherTenants: []string{"alice", "carol"},
	}
	var out strings.Builder
	printStory(&out, st)
	require.Contains(t, out.String(), "  25  delivery  not replayed  refused: 400 Bad Request\n")
	require.Contains(t, out.String(), "  19  http  replayed 2026-03-01T12:00:00Z  boom\n")
	require.Contains(t, out.String(), "message k1 of pipeline orders (tenant bob)\n  also held by tenants alice, carol")
}

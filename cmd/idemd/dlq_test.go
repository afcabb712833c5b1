package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/internal/metricstest"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/outbox"
)

// TestDLQReplayEveryKind: `idemd dlq replay` sends each letter back through the door that
// wrote it — a webhook through its source, a Kafka record through its subscription (with no
// broker configured: replay reads nothing from Kafka), an HTTP delivery by requeueing it —
// applies each once, and refuses a second replay.
func TestDLQReplayEveryKind(t *testing.T) {
	t.Parallel()
	schema, pool := migratedSchema(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %[1]s.payments (event_id text PRIMARY KEY, amount bigint);
CREATE TABLE %[1]s.ledger (event_id text PRIMARY KEY, amount bigint, topic text, off bigint)`, schema))
	require.NoError(t, err)

	file := filepath.Join(t.TempDir(), "idemd.yaml")
	require.NoError(t, os.WriteFile(file, []byte(fmt.Sprintf(`sources:
  - name: stripe
    verify: {scheme: stripe, secrets_env: [DLQ_STRIPE_SECRET]}
    effect:
      sql: "INSERT INTO %[1]s.payments (event_id, amount) VALUES (@message_id, (@payload::jsonb ->> 'amount')::bigint)"
subscriptions:
  - name: ledger
    topics: [payments]
    effect: {sql: "INSERT INTO %[1]s.ledger (event_id, amount, topic, off) VALUES (@message_id, (@payload::jsonb ->> 'amount')::bigint, @topic, @offset)"}
    publish: {topic: ledger.entries}
`, schema)), 0o600))

	// The letters, as each door writes them.
	letters := deadletter.New(schema)
	var webhook, record, sink, stranger, tooLarge, deliveryID int64
	tooLargeOp := outbox.OperationID("stripe", "evt_big", 0)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		if webhook, err = letters.WriteTx(ctx, tx, &deadletter.Letter{
			Pipeline: "stripe", Origin: deadletter.Origin{Door: deadletter.DoorHTTP}, Scope: "stripe", MessageID: "evt_1", Payload: []byte(`{"amount":7}`),
			Headers:  map[string][]string{"Content-Type": {"application/json"}},
			Metadata: map[string]any{"method": "POST", "path": "/webhooks/stripe", "tenant": ""},
			Reason:   "boom", Attempts: 1,
		}); err != nil {
			return err
		}
		if record, err = letters.WriteTx(ctx, tx, &deadletter.Letter{
			Pipeline: "ledger", Origin: deadletter.Origin{Door: deadletter.DoorKafka}, Scope: "ledger", MessageID: "op_1", Payload: []byte(`{"amount":9}`),
			Headers:  map[string][]string{"operation-id": {"op_1"}},
			Metadata: map[string]any{"topic": "payments", "partition": 2, "offset": 41, "timestamp": "2026-01-02T03:04:05Z"},
			Reason:   "boom", Attempts: 5,
		}); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, `INSERT INTO `+schema+`.http_deliveries
    (endpoint, operation_id, pipeline, causation_id, payload, state, attempts, finished_at)
VALUES ('ledger', $1, 'ledger', 'op_0', '{}', 'dead', 8, now()) RETURNING id`, uuid.New()).Scan(&deliveryID); err != nil {
			return err
		}
		if sink, err = letters.WriteTx(ctx, tx, &deadletter.Letter{
			Pipeline: "ledger", Origin: deadletter.Origin{Door: deadletter.DoorDelivery, DeliveryID: deliveryID}, Scope: "http:ledger", MessageID: "x", Payload: []byte(`{}`),
			Metadata: map[string]any{"endpoint": "ledger"},
			Reason:   "500", Attempts: 8,
		}); err != nil {
			return err
		}
		// An event the relay moved out of the outbox because the broker refused it as too
		// large: pipeline "stripe" is a source, but this letter must not re-run its effect.
		if tooLarge, err = letters.WriteTx(ctx, tx, &deadletter.Letter{
			Pipeline: "stripe", Origin: deadletter.Origin{Door: deadletter.DoorRelay, OutboxID: 3, OperationID: tooLargeOp}, Scope: "kafka:payments", MessageID: "evt_big", Payload: []byte(`{"big":true}`),
			Headers:  map[string][]string{"operation-id": {tooLargeOp.String()}, "content-type": {"application/json"}},
			Metadata: map[string]any{"topic": "payments", "key": "pi_9"},
			Reason:   "too large", Attempts: 1,
		}); err != nil {
			return err
		}
		stranger, err = letters.WriteTx(ctx, tx, &deadletter.Letter{Pipeline: "gone", Origin: deadletter.Origin{Door: deadletter.DoorKafka}, Scope: "gone", MessageID: "y", Reason: "x"})
		return err
	}))

	vars := map[string]string{
		"IDEMD_DATABASE_URL":   pgtest.URL(),
		"IDEMD_DB_SCHEMA":      schema,
		"IDEMD_PIPELINES_FILE": file,
		"DLQ_STRIPE_SECRET":    "whsec_dlq_test_secret_01",
	}
	ids := []string{fmt.Sprint(webhook), fmt.Sprint(record), fmt.Sprint(sink), fmt.Sprint(tooLarge), fmt.Sprint(stranger)}
	code, out, _ := runIdemd(t, vars, append([]string{"dlq", "replay"}, ids...)...)
	require.Equal(t, exitFailure, code, "one letter could not be replayed")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 5, out)
	require.Equal(t, fmt.Sprintf(`%d: replayed through source "stripe"`, webhook), lines[0])
	require.Equal(t, fmt.Sprintf(`%d: replayed through subscription "ledger"`, record), lines[1])
	require.Equal(t, fmt.Sprintf(`%d: delivery %d requeued to endpoint "ledger" with the same operation id`, sink, deliveryID), lines[2])
	require.Equal(t, fmt.Sprintf(`%d: event requeued to topic "payments" with the same operation id %s`, tooLarge, tooLargeOp), lines[3])
	require.Contains(t, lines[4], fmt.Sprintf(`%d: not replayed: dead letter %d (door kafka, pipeline "gone"): no door replays this dead letter`, stranger, stranger))

	count := func(from string, args ...any) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+"."+from, args...).Scan(&n))
		return n
	}
	// USER is unset here: the audit names the uid.
	require.Equal(t, 5, count("admin_audit WHERE actor = $1", fmt.Sprintf("cli:uid:%d", os.Getuid())))
	check := func() {
		require.Equal(t, 1, count("payments WHERE event_id = 'evt_1' AND amount = 7"))
		require.Equal(t, 1, count("ledger WHERE event_id = 'op_1' AND amount = 9 AND topic = 'payments' AND off = 41"))
		require.Equal(t, 1, count("outbox WHERE causation_id = 'op_1' AND operation_id = $1", outbox.OperationID("ledger", "op_1", 0)))
		require.Equal(t, 1, count("http_deliveries WHERE id = $1 AND state = 'pending' AND attempts = 0", deliveryID))
		require.Equal(t, 1, count("outbox WHERE operation_id = $1 AND topic = 'payments' AND key = 'pi_9' AND headers ->> 'content-type' = 'application/json'", tooLargeOp))
		require.Equal(t, 0, count("payments WHERE event_id = 'evt_big'"), "the source's effect is not run again")
		require.Equal(t, 4, count("dead_letters WHERE replayed_at IS NOT NULL"))
	}
	check()

	// Again: each is refused and nothing is applied twice.
	code, out, _ = runIdemd(t, vars, append([]string{"dlq", "replay"}, ids[:4]...)...)
	require.Equal(t, exitFailure, code)
	for _, id := range ids[:4] {
		require.Contains(t, out, id+": not replayed: it was replayed before; not run again")
	}
	check()
}

// TestDLQListEscapesSenderText: message ids, reasons, headers and payloads of dead letters
// come from senders. `idemd dlq list` (table and -json) and `idemd dlq replay` print them
// with every non-printable character escaped: no terminal escape, C1 control or
// bidirectional override reaches the operator's screen.
func TestDLQListEscapesSenderText(t *testing.T) {
	t.Parallel()
	schema, pool := migratedSchema(t)
	ctx := context.Background()
	const (
		hostileID     = "evt_\x1b[2J\x1b]0;owned\x07_\u009b31m"
		hostileReason = "boom \x1b[31mred\u202etxt.exe"
	)
	var id int64
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		id, err = deadletter.New(schema).WriteTx(ctx, tx, &deadletter.Letter{
			Pipeline: "gone", Origin: deadletter.Origin{Door: deadletter.DoorHTTP}, Scope: "gone", MessageID: hostileID, Reason: hostileReason,
			Payload: []byte("{\"x\":\"\u0085\u2028\"}"), Headers: map[string][]string{"X-Evil": {"\u009b2J"}},
		})
		return err
	}))
	vars := letterVars(t, schema)
	raw := func(out string) {
		t.Helper()
		for _, r := range out {
			require.False(t, r == 0x1b || r == 0x07 || (r >= 0x80 && r <= 0x9f) || r == 0x202e || r == 0x2028,
				"raw %U reached the terminal:\n%q", r, out)
		}
	}
	code, out, _ := runIdemd(t, vars, "dlq", "list")
	require.Equal(t, exitOK, code)
	raw(out)
	require.Contains(t, out, `evt_\x1b[2J\x1b]0;owned\x07_\u009b31m`)
	require.Contains(t, out, `boom \x1b[31mred\u202etxt.exe`)

	code, out, _ = runIdemd(t, vars, "dlq", "list", "-json")
	require.Equal(t, exitOK, code)
	raw(out)
	var got listedLetter
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	require.Equal(t, hostileID, got.MessageID, "the JSON still decodes to the stored text")
	require.Equal(t, hostileReason, got.Reason)
	require.Equal(t, "{\"x\":\"\u0085\u2028\"}", got.Payload.Data)
	require.Equal(t, "utf-8", got.Payload.Encoding)
	require.Equal(t, []string{"\u009b2J"}, got.Headers["X-Evil"])

	code, out, _ = runIdemd(t, vars, "dlq", "replay", fmt.Sprint(id))
	require.Equal(t, exitFailure, code)
	raw(out)
}

// TestDLQListShowsWhatTheAPIShows: `idemd dlq list -json` prints each letter as the admin
// API does: secret headers redacted, a payload that is not UTF-8 in base64 (not mangled),
// URLs in the reason cut to scheme and host.
func TestDLQListShowsWhatTheAPIShows(t *testing.T) {
	t.Parallel()
	schema, pool := migratedSchema(t)
	ctx := context.Background()
	binary := []byte("bin\xff\xfe")
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := deadletter.New(schema).WriteTx(ctx, tx, &deadletter.Letter{
			Pipeline: "ledger", Origin: deadletter.Origin{Door: deadletter.DoorKafka}, Scope: "ledger", MessageID: "op-bin-1",
			Reason:  "POST https://hooks.example/services/T0/B0/s3cr3t: 400",
			Payload: binary, Headers: map[string][]string{"Authorization": {"Bearer leak-me"}, "Stripe-Signature": {"t=1,v1=ab"}, "X-Plain": {"shown"}},
		})
		return err
	}))
	vars := letterVars(t, schema)
	for _, args := range [][]string{{"dlq", "list", "-json"}, {"dlq", "list"}} {
		code, out, _ := runIdemd(t, vars, args...)
		require.Equal(t, exitOK, code)
		require.NotContains(t, out, "leak-me", "%v", args)
		require.NotContains(t, out, "v1=ab", "%v", args)
		require.NotContains(t, out, "s3cr3t", "%v", args)
	}
	_, out, _ := runIdemd(t, vars, "dlq", "list", "-json")
	var got listedLetter
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	require.Equal(t, "base64", got.Payload.Encoding)
	decoded, err := base64.StdEncoding.DecodeString(got.Payload.Data)
	require.NoError(t, err)
	require.Equal(t, binary, decoded, "the payload's bytes, whole")
	require.Equal(t, []string{"[redacted]"}, got.Headers["Authorization"])
	require.Equal(t, []string{"[redacted]"}, got.Headers["Stripe-Signature"])
	require.Equal(t, []string{"shown"}, got.Headers["X-Plain"])
	require.Equal(t, "POST https://hooks.example/[redacted] 400", got.Reason)
}

// listedLetter is what the tests read of a line of `idemd dlq list -json`.
type listedLetter struct {
	MessageID string `json:"message_id"`
	Reason    string `json:"reason"`
	Payload   struct {
		Data     string `json:"data"`
		Encoding string `json:"encoding"`
	} `json:"payload"`
	Headers map[string][]string `json:"headers"`
}

// letterVars is the environment of a dlq command on schema's letters, with a pipelines
// file of one source.
func letterVars(t *testing.T, schema string) map[string]string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "idemd.yaml")
	require.NoError(t, os.WriteFile(file, []byte("sources:\n  - name: stripe\n    verify: {scheme: stripe, secrets_env: [DLQ_STRIPE_SECRET]}\n"), 0o600))
	return map[string]string{
		"IDEMD_DATABASE_URL": pgtest.URL(), "IDEMD_DB_SCHEMA": schema, "IDEMD_PIPELINES_FILE": file,
		"DLQ_STRIPE_SECRET": "whsec_dlq_escape_test_secret",
	}
}

// TestDLQReplayDev: with no pipelines file, the letters of an `idemd dev` run are replayed
// through dev's embedded pipelines, with dev's schema of example tables first on the
// search_path, as `idemd sign` falls back to them. A schema dev never ran on (no
// {IDEMD_DB_SCHEMA}_dev) does not fall back: the missing file is reported as before.
func TestDLQReplayDev(t *testing.T) {
	t.Parallel()
	schema, pool := migratedSchema(t)
	require.NoError(t, createDevTables(pgtest.URL(), schema+"_dev"))
	ctx := context.Background()
	var id int64
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		id, err = deadletter.New(schema).WriteTx(ctx, tx, &deadletter.Letter{
			Pipeline: "stripe", Origin: deadletter.Origin{Door: deadletter.DoorHTTP}, Scope: "stripe", MessageID: "evt_dev_1",
			Payload:  []byte(`{"id":"evt_dev_1","type":"charge.succeeded","data":{"object":{"id":"pi_dev_1","amount":7}}}`),
			Headers:  map[string][]string{"Content-Type": {"application/json"}},
			Metadata: map[string]any{"method": "POST", "path": "/webhooks/stripe", "tenant": ""},
			Reason:   "invalid input syntax for type bigint", Attempts: 5,
		})
		return err
	}))

	code, out, errOut := runIdemd(t, map[string]string{"IDEMD_DATABASE_URL": pgtest.URL(), "IDEMD_DB_SCHEMA": schema}, "dlq", "replay", fmt.Sprint(id))
	require.Equal(t, exitOK, code, "%s%s", out, errOut)
	require.Equal(t, fmt.Sprintf("%d: replayed through source \"stripe\"\n", id), out)
	require.Contains(t, errOut, "replaying through dev's pipelines")
	var amount int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT amount FROM "+schema+"_dev.payments WHERE event_id = 'evt_dev_1'").Scan(&amount))
	require.EqualValues(t, 7, amount, "the effect ran in dev's example schema")

	other, _ := migratedSchema(t)
	code, _, errOut = runIdemd(t, map[string]string{"IDEMD_DATABASE_URL": pgtest.URL(), "IDEMD_DB_SCHEMA": other}, "dlq", "replay", "1")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "the pipelines file idemd.yaml was not found")
}

// TestReplayerSeries: the daemon's replayer (the admin API's) has every door's replay
// series of every pipeline at 0 before any replay, so that the first replays show in
// rate(), and so has each pipeline's message series; a webhook and a record replayed through it count once each as processed and as
// replayed.
func TestReplayerSeries(t *testing.T) {
	t.Parallel()
	schema, pool := migratedSchema(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %[1]s.payments (event_id text PRIMARY KEY);
CREATE TABLE %[1]s.ledger (event_id text PRIMARY KEY)`, schema))
	require.NoError(t, err)
	// Pipelines of their own: their metrics are their own.
	src, sub := schema+".stripe", schema+".ledger"
	file := filepath.Join(t.TempDir(), "idemd.yaml")
	require.NoError(t, os.WriteFile(file, []byte(fmt.Sprintf(`sources:
  - name: %[2]s
    verify: {scheme: stripe, secrets_env: [DLQ_STRIPE_SECRET]}
    effect: {sql: "INSERT INTO %[1]s.payments (event_id) VALUES (@message_id)"}
subscriptions:
  - name: %[3]s
    topics: [payments]
    effect: {sql: "INSERT INTO %[1]s.ledger (event_id) VALUES (@message_id)"}
`, schema, src, sub)), 0o600))
	f, err := loadPipelines(file, func(string) (string, bool) { return "whsec_dlq_test_secret_01", true })
	require.NoError(t, err)
	quiet := logrus.New()
	quiet.SetOutput(io.Discard)
	rp, closeDoors := newReplayer(pool, &Env{DBSchema: schema}, f, logrus.NewEntry(quiet))
	t.Cleanup(closeDoors)

	series := func(name string, labels map[string]string) (float64, int) { return metricstest.Sum(t, name, labels) }
	for _, s := range []struct{ pipeline, door, outcome string }{
		{src, "http", "applied"}, {src, "http", "stale"}, {src, "relay", "requeued"}, {src, "delivery", "requeued"},
		{sub, "kafka", "applied"}, {sub, "kafka", "stale"}, {sub, "relay", "requeued"}, {sub, "delivery", "requeued"},
	} {
		v, n := series("idemd_dead_letters_replayed_total", map[string]string{"pipeline": s.pipeline, "door": s.door, "outcome": s.outcome})
		require.Equal(t, 1, n, "%+v exists", s)
		require.Zero(t, v, "%+v", s)
	}
	// Every door creates its pipelines' message series at 0 when it is built
	// (metrics.Pipeline): an alert on increase(), such as IdemdDeadLetters, sees a
	// pipeline's first dead letter after a start.
	for _, p := range []struct{ pipeline, door string }{{src, "http"}, {sub, "kafka"}} {
		v, n := series("idemd_messages_received_total", map[string]string{"pipeline": p.pipeline, "door": p.door})
		require.Equal(t, 1, n, "received %+v exists", p)
		require.Zero(t, v, "received %+v", p)
		for _, name := range []string{"processed", "duplicate", "conflict", "dead_lettered", "stale"} {
			v, n := series("idemd_messages_"+name+"_total", map[string]string{"pipeline": p.pipeline})
			require.Equal(t, 1, n, "%s %+v exists", name, p)
			require.Zero(t, v, "%s %+v", name, p)
		}
	}
	_, n := series("idemd_messages_in_flight_total", map[string]string{"pipeline": src})
	require.Equal(t, 1, n, "in flight %s exists", src)

	letters := deadletter.New(schema)
	var webhook, record int64
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		if webhook, err = letters.WriteTx(ctx, tx, &deadletter.Letter{
			Pipeline: src, Origin: deadletter.Origin{Door: deadletter.DoorHTTP}, Scope: src, MessageID: "evt_1", Payload: []byte(`{}`),
			Metadata: map[string]any{"method": "POST", "path": "/webhooks/" + src, "tenant": ""}, Reason: "boom", Attempts: 1,
		}); err != nil {
			return err
		}
		record, err = letters.WriteTx(ctx, tx, &deadletter.Letter{
			Pipeline: sub, Origin: deadletter.Origin{Door: deadletter.DoorKafka}, Scope: sub, MessageID: "op_1", Payload: []byte(`{}`),
			Metadata: map[string]any{"topic": "payments", "partition": 0, "offset": 1}, Reason: "boom", Attempts: 1,
		})
		return err
	}))
	for _, id := range []int64{webhook, record} {
		_, err := rp.Replay(ctx, id)
		require.NoError(t, err)
	}
	for _, s := range []struct{ pipeline, door string }{{src, "http"}, {sub, "kafka"}} {
		v, _ := series("idemd_messages_processed_total", map[string]string{"pipeline": s.pipeline})
		require.Equal(t, 1.0, v, "%s processed", s.pipeline)
		v, _ = series("idemd_dead_letters_replayed_total", map[string]string{"pipeline": s.pipeline, "door": s.door, "outcome": "applied"})
		require.Equal(t, 1.0, v, "%s replayed", s.pipeline)
	}
}

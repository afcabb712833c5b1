package receiver

import (
	"context"
	"encoding/hex"
	"fmt"
	"net/http"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/outbox"
	"github.com/idemd/idemd/pipeline"
)

// TestFanOut: one webhook, several targets. Each target whose filter matches gets exactly
// one event (outbox row or HTTP delivery) with its own operation id, derived from the
// pipeline, the message id and the target's name; the first unnamed target keeps the id an
// event had before fan-out; a resend adds nothing.
func TestFanOut(t *testing.T) {
	t.Parallel()
	b := setup(t, 8, func(db *pgtest.DB) Config {
		s := stripeSource(db)
		s.Publish = pipeline.Targets{
			{Topic: "webhooks.stripe", Key: &pipeline.Field{JSON: "/data/object/id"}},
			{Name: "invoices", HTTP: &pipeline.HTTP{URL: "https://erp.example/hooks"}, Filter: &pipeline.Filter{Type: []string{"invoice.*"}}},
			{Name: "payments", HTTP: &pipeline.HTTP{URL: "https://pay.example/hooks"}, Filter: &pipeline.Filter{Type: []string{"payment_intent.*"}}},
			{Name: "big", Topic: "big.payments", Filter: &pipeline.Filter{JSON: "/data/object/amount", In: []string{"5000"}}},
		}
		return Config{Sources: []Source{s}}
	})
	ops := func(id string) map[string]uuid.UUID {
		out := map[string]uuid.UUID{}
		rows, err := b.db.Pool.Query(context.Background(), b.db.Q(`
SELECT 'topic:' || topic, operation_id FROM {schema}.outbox WHERE causation_id = $1
UNION ALL SELECT 'endpoint:' || endpoint, operation_id FROM {schema}.http_deliveries WHERE causation_id = $1`), id)
		require.NoError(t, err)
		for rows.Next() {
			var target string
			var op uuid.UUID
			require.NoError(t, rows.Scan(&target, &op))
			require.NotContains(t, out, target, "one event per target")
			out[target] = op
		}
		require.NoError(t, rows.Err())
		return out
	}

	require.Equal(t, 200, b.stripe(t, stripeEvent("evt_1", 5000, "")).status)
	require.Equal(t, map[string]uuid.UUID{
		"topic:webhooks.stripe":    outbox.OperationID("stripe", "evt_1", 0),
		"endpoint:stripe:payments": outbox.TargetOperationID("stripe", "evt_1", "payments"),
		"topic:big.payments":       outbox.TargetOperationID("stripe", "evt_1", "big"),
	}, ops("evt_1"), "the invoice target is filtered out by type")

	require.Equal(t, 200, b.stripe(t, stripeEvent("evt_2", 10, "")).status)
	require.Len(t, ops("evt_2"), 2, "the big target is filtered out by value")

	require.Equal(t, "duplicate", b.stripe(t, stripeEvent("evt_1", 5000, "")).json(t)["status"])
	require.Len(t, ops("evt_1"), 3, "a resend publishes nothing")
	require.Equal(t, 2, b.db.Count(t, "{schema}.http_deliveries"))
}

// TestCompositeMessageID: an Adyen-style notification is unique by eventCode and
// pspReference together. Two notifications that differ only in the second part are two
// messages; a resend of one is a duplicate; parts that a plain separator would join alike
// stay apart; a missing part is a missing id (400).
func TestCompositeMessageID(t *testing.T) {
	t.Parallel()
	const secret = "adyen-hmac-secret-0123456789"
	b := setup(t, 4, func(db *pgtest.DB) Config {
		return Config{Sources: []Source{{
			Name:      "adyen",
			Verify:    Verify{Scheme: SchemeHMACSHA256, Secrets: []string{secret}, Header: "X-Signature"},
			MessageID: &pipeline.Field{Parts: []pipeline.Field{{JSON: "/eventCode"}, {JSON: "/pspReference"}}},
			Effect:    Effect{SQL: db.Q(`INSERT INTO {schema}.effects (message_id, body) VALUES (@message_id, @payload::jsonb)`)},
		}}}
	})
	send := func(eventCode, psp string) resp {
		body := []byte(fmt.Sprintf(`{"eventCode":%q,"pspReference":%q,"success":"true"}`, eventCode, psp))
		if psp == "" {
			body = []byte(fmt.Sprintf(`{"eventCode":%q,"success":"true"}`, eventCode))
		}
		return do(t, nil, "POST", b.srv.URL+"/webhooks/adyen", body,
			http.Header{"X-Signature": {hex.EncodeToString(hmacSHA256([]byte(secret), body))}})
	}

	r := send("AUTHORISATION", "8535296650153317")
	require.Equal(t, 200, r.status, "%s", r.body)
	require.Equal(t, map[string]any{"status": "processed", "message_id": "13:AUTHORISATION/16:8535296650153317"}, r.json(t))
	r = send("AUTHORISATION", "8535296650153318")
	require.Equal(t, "processed", r.json(t)["status"], "differs only in the second part: another message")
	r = send("AUTHORISATION", "8535296650153317")
	require.Equal(t, "duplicate", r.json(t)["status"], "a resend is deduplicated")
	require.Equal(t, 2, b.effects(t))

	require.Equal(t, "processed", send("a:b", "c").json(t)["status"])
	require.Equal(t, "processed", send("a", "b:c").json(t)["status"], `("a:b","c") and ("a","b:c") are different ids`)
	require.Equal(t, 4, b.effects(t))

	r = send("CAPTURE", "")
	require.Equal(t, 400, r.status)
	require.Equal(t, "missing-message-id", r.problemType(t))
	require.Equal(t, 4, b.effects(t))
}

package receiver

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
)

// TestSignatureOverRawBytes: the signature is checked against the bytes the sender sent
// (SPEC 2.4), not a re-encoding of them. A pretty-printed body, signed as sent, is
// accepted; the same body with a signature over its compact form is refused.
func TestSignatureOverRawBytes(t *testing.T) {
	t.Parallel()
	b := setup(t, 4, func(db *pgtest.DB) Config { return Config{Sources: []Source{stripeSource(db)}} })
	pretty := []byte("{\n  \"object\": \"event\",\n  \"id\": \"evt_pretty\",\n  \"type\": \"payment_intent.succeeded\",\n" +
		"  \"data\": { \"object\": { \"id\": \"pi_1\", \"amount\": 700 } }\n}\n")
	var compact bytes.Buffer
	require.NoError(t, json.Compact(&compact, pretty))

	r := do(t, nil, "POST", b.srv.URL+"/webhooks/stripe", pretty,
		http.Header{"Stripe-Signature": {stripeSig(testSecret, time.Now(), compact.Bytes())}})
	require.Equal(t, http.StatusUnauthorized, r.status, "%s", r.body)
	require.Zero(t, b.effects(t))

	r = do(t, nil, "POST", b.srv.URL+"/webhooks/stripe", pretty,
		http.Header{"Stripe-Signature": {stripeSig(testSecret, time.Now(), pretty)}})
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Equal(t, "processed", r.json(t)["status"])
	require.Equal(t, 1, b.effects(t))
}

// TestEverySecretVerifies: with several secrets configured (rotation), a request signed
// with any one of them is accepted, the first as well as the last, and one signed with a
// secret not configured is refused; for every HMAC scheme.
func TestEverySecretVerifies(t *testing.T) {
	t.Parallel()
	mac := func(key []byte, parts ...string) []byte {
		h := hmac.New(sha256.New, key)
		for _, p := range parts {
			h.Write([]byte(p))
		}
		return h.Sum(nil)
	}
	now := time.Now()
	ts := strconv.FormatInt(now.Unix(), 10)
	body := `{"id":"evt_rotation","event_id":"Ev_rotation"}`
	swKey := func(i int) string {
		return "whsec_" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{byte('a' + i)}, 24))
	}
	plain := func(i int) string { return "secret-number-" + strconv.Itoa(i) + "-of-the-rotation" }
	for _, tc := range []struct {
		verify Verify
		secret func(i int) string
		sign   func(secret string) http.Header
	}{
		{Verify{Scheme: SchemeStripe}, func(i int) string { return "whsec_" + plain(i) }, func(s string) http.Header {
			return hdr("Stripe-Signature", "t="+ts+",v1="+hex.EncodeToString(mac([]byte(s), ts, ".", body)))
		}},
		{Verify{Scheme: SchemeStandardWebhooks}, swKey, func(s string) http.Header {
			key, err := base64.StdEncoding.DecodeString(s[len("whsec_"):])
			require.NoError(t, err)
			return swHdr("msg_rotation", ts, "v1,"+base64.StdEncoding.EncodeToString(mac(key, "msg_rotation", ".", ts, ".", body)))
		}},
		{Verify{Scheme: SchemeGitHub}, plain, func(s string) http.Header {
			return hdr("X-GitHub-Delivery", "d1", "X-Hub-Signature-256", "sha256="+hex.EncodeToString(mac([]byte(s), body)))
		}},
		{Verify{Scheme: SchemeShopify}, plain, func(s string) http.Header {
			return hdr("X-Shopify-Event-Id", "e1", "X-Shopify-Hmac-Sha256", base64.StdEncoding.EncodeToString(mac([]byte(s), body)))
		}},
		{Verify{Scheme: SchemeSlack}, plain, func(s string) http.Header {
			return hdr("X-Slack-Request-Timestamp", ts, "X-Slack-Signature", "v0="+hex.EncodeToString(mac([]byte(s), "v0:", ts, ":", body)))
		}},
		{Verify{Scheme: SchemeHMACSHA256, Header: "X-Signature", Encoding: "hex"}, plain, func(s string) http.Header {
			return hdr("X-Signature", hex.EncodeToString(mac([]byte(s), body)))
		}},
	} {
		t.Run(tc.verify.Scheme, func(t *testing.T) {
			v := tc.verify
			v.Secrets = []string{tc.secret(0), tc.secret(1), tc.secret(2)}
			vf := mustVerifier(t, v)
			for i := range 3 {
				require.Empty(t, reason(t, vf, tc.sign(tc.secret(i)), body, now), "signed with configured secret %d of 3", i+1)
			}
			require.Equal(t, "signature does not match (wrong secret or body altered)", reason(t, vf, tc.sign(tc.secret(3)), body, now), "signed with a secret not configured")
		})
	}
}

// TestRetentionReachesRecords: a source's retention is its records' (SPEC 1.6): a webhook's
// dedup record expires its source's retention after it was received, an API key its
// idempotency retention after, and each defaults as documented.
func TestRetentionReachesRecords(t *testing.T) {
	t.Parallel()
	b := setup(t, 4, func(db *pgtest.DB) Config {
		short, long := stripeSource(db), stripeSource(db)
		short.Name, short.Retention, short.Publish = "short", 50*time.Hour, nil
		long.Name, long.Publish = "default", nil
		api, apiDefault := ordersSource(db), ordersSource(db)
		api.Name, api.Path, api.Idempotency = "api", "/v1/api", &Idempotency{Required: true, Retention: 3 * time.Hour}
		apiDefault.Name, apiDefault.Path, apiDefault.Publish = "api-default", "/v1/api-default", nil
		api.Publish = nil
		return Config{Sources: []Source{short, long, api, apiDefault}}
	})
	for _, src := range []string{"short", "default"} {
		body := stripeEvent("evt_"+src, 1, "")
		r := do(t, nil, "POST", b.srv.URL+"/webhooks/"+src, body, http.Header{"Stripe-Signature": {stripeSig(testSecret, time.Now(), body)}})
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	}
	for _, path := range []string{"/v1/api", "/v1/api-default"} {
		r := do(t, nil, "POST", b.srv.URL+path, []byte(`{"amount":1}`), http.Header{
			"Authorization": {"Bearer token-a-0123456789"}, "Idempotency-Key": {"k1"}, "Content-Type": {"application/json"}})
		require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	}
	for scope, want := range map[string]time.Duration{
		"short": 50 * time.Hour, "default": 7 * 24 * time.Hour,
		"api\x1fa": 3 * time.Hour, "api-default\x1fa": 24 * time.Hour,
	} {
		var kept time.Duration
		require.NoError(t, b.db.Pool.QueryRow(t.Context(), b.db.Q(
			`SELECT extract(epoch FROM expires_at - received_at) * 1e9 FROM {schema}.processed_messages WHERE scope = $1`), scope).Scan(&kept), scope)
		require.InDelta(t, want.Seconds(), kept.Seconds(), 60, "scope %q keeps its records %s", scope, kept)
	}
}

package receiver

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/internal/signkey"
	"github.com/idemd/idemd/pipeline"
)

const (
	swSecret   = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	swID       = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	swBody     = `{"test": 2432232314}`
	swSig      = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
	vectorTS   = 1614265330
	stSecret   = "whsec_test_secret"
	stBody     = `{"id":"evt_test_webhook","object":"event"}`
	stSig      = "3c5817089d739023dd6190f70a3757e04f7a2fd8b5dab12c2e000f51970dccff"
	ghSecret   = "It's a Secret to Everybody"
	ghBody     = "Hello, World!"
	ghSig      = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
	shopSecret = "hush"
	shopBody   = `{"id":123}`
	shopSig    = "75DK9h3ZbLv2nIMppOFKPFxSYU9PgXvd4NXUhSs88Jk="
)

var vectorNow = time.Unix(vectorTS, 0)

func mustVerifier(t *testing.T, v Verify) verifier {
	t.Helper()
	vf, err := newVerifier(v, false)
	require.NoError(t, err)
	return vf
}

func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

// reason returns the log reason of a failed verification ("" when it passed).
func reason(t *testing.T, v verifier, h http.Header, body string, now time.Time) string {
	t.Helper()
	_, err := v.verify(h, []byte(body), now)
	if err == nil {
		return ""
	}
	var ve *verifyError
	require.ErrorAs(t, err, &ve)
	return ve.reason
}

func swHdr(id, ts, sig string) http.Header {
	return hdr("webhook-id", id, "webhook-timestamp", ts, "webhook-signature", sig)
}

func TestVectors(t *testing.T) {
	t.Parallel()
	ts := strconv.Itoa(vectorTS)

	sw := mustVerifier(t, Verify{Scheme: SchemeStandardWebhooks, Secrets: []string{swSecret}})
	require.Empty(t, reason(t, sw, swHdr(swID, ts, swSig), swBody, vectorNow))
	svix := hdr("svix-id", swID, "svix-timestamp", ts, "svix-signature", swSig)
	require.Empty(t, reason(t, sw, svix, swBody, vectorNow), "svix-* header names")

	st := mustVerifier(t, Verify{Scheme: SchemeStripe, Secrets: []string{stSecret}})
	require.Empty(t, reason(t, st, hdr("Stripe-Signature", "t="+ts+",v1="+stSig), stBody, vectorNow))

	gh := mustVerifier(t, Verify{Scheme: SchemeGitHub, Secrets: []string{ghSecret}})
	require.Empty(t, reason(t, gh, hdr("X-Hub-Signature-256", ghSig), ghBody, vectorNow))

	// Shopify's published vector uses a 4-byte key, which New refuses (internal/signkey):
	// the verifier is built directly to check the computation against it.
	sh := bodyHMACVerifier{keys: [][]byte{[]byte(shopSecret)}, header: "X-Shopify-Hmac-Sha256", base64: true}
	require.Empty(t, reason(t, sh, hdr("X-Shopify-Hmac-Sha256", shopSig), shopBody, vectorNow))

	// The generic scheme reproduces github and shopify.
	g2 := mustVerifier(t, Verify{Scheme: SchemeHMACSHA256, Secrets: []string{ghSecret}, Header: "X-Sig", Prefix: "sha256="})
	require.Empty(t, reason(t, g2, hdr("X-Sig", ghSig), ghBody, vectorNow))
	s2 := bodyHMACVerifier{keys: [][]byte{[]byte(shopSecret)}, header: "X-Sig", base64: true}
	require.Empty(t, reason(t, s2, hdr("X-Sig", shopSig), shopBody, vectorNow))

	sl := mustVerifier(t, Verify{Scheme: SchemeSlack, Secrets: []string{"slack-signing-secret-01"}})
	mac := hex.EncodeToString(hmacSHA256([]byte("slack-signing-secret-01"), []byte("v0:"+ts+":"), []byte(`{"event_id":"Ev1"}`)))
	require.Empty(t, reason(t, sl, hdr("X-Slack-Signature", "v0="+mac, "X-Slack-Request-Timestamp", ts), `{"event_id":"Ev1"}`, vectorNow))
}

func TestVerifyNegative(t *testing.T) {
	t.Parallel()
	ts := strconv.Itoa(vectorTS)
	st := mustVerifier(t, Verify{Scheme: SchemeStripe, Secrets: []string{stSecret}})
	sw := mustVerifier(t, Verify{Scheme: SchemeStandardWebhooks, Secrets: []string{swSecret}})
	wrong := strings.Repeat("ab", 32)
	mismatch := "signature does not match (wrong secret or body altered)"

	t.Run("re-serialized body", func(t *testing.T) {
		require.Equal(t, mismatch, reason(t, st, hdr("Stripe-Signature", "t="+ts+",v1="+stSig),
			`{"id": "evt_test_webhook", "object": "event"}`, vectorNow))
		require.Equal(t, mismatch, reason(t, sw, swHdr(swID, ts, swSig), `{"test":2432232314}`, vectorNow))
	})
	t.Run("stripe only v0", func(t *testing.T) {
		require.Contains(t, reason(t, st, hdr("Stripe-Signature", "t="+ts+",v0="+stSig), stBody, vectorNow), "only v0")
	})
	t.Run("stripe one wrong and one right v1", func(t *testing.T) {
		require.Empty(t, reason(t, st, hdr("Stripe-Signature", "t="+ts+",v1="+wrong+",v1="+stSig+",v0=00"), stBody, vectorNow))
		require.Empty(t, reason(t, st, hdr("Stripe-Signature", "t="+ts+",v1="+stSig+",v1="+wrong), stBody, vectorNow))
	})
	t.Run("standard webhooks several signatures one valid", func(t *testing.T) {
		sigs := "v1,Zm9v v1," + base64.StdEncoding.EncodeToString(make([]byte, 32)) + " " + swSig + " v2,whatever"
		require.Empty(t, reason(t, sw, swHdr(swID, ts, sigs), swBody, vectorNow))
	})
	t.Run("tolerance both ways", func(t *testing.T) {
		at, past := vectorNow.Add(300*time.Second), vectorNow.Add(301*time.Second)
		require.Empty(t, reason(t, st, hdr("Stripe-Signature", "t="+ts+",v1="+stSig), stBody, at))
		require.Equal(t, "clock skew of 301 s exceeds the tolerance of 300 s",
			reason(t, st, hdr("Stripe-Signature", "t="+ts+",v1="+stSig), stBody, past))
		early, tooEarly := vectorNow.Add(-300*time.Second), vectorNow.Add(-301*time.Second)
		require.Empty(t, reason(t, st, hdr("Stripe-Signature", "t="+ts+",v1="+stSig), stBody, early))
		require.Equal(t, "clock skew of -301 s exceeds the tolerance of 300 s",
			reason(t, st, hdr("Stripe-Signature", "t="+ts+",v1="+stSig), stBody, tooEarly))
		require.Empty(t, reason(t, sw, swHdr(swID, ts, swSig), swBody, at))
		require.Empty(t, reason(t, sw, swHdr(swID, ts, swSig), swBody, early))
		require.Contains(t, reason(t, sw, swHdr(swID, ts, swSig), swBody, past), "clock skew of 301 s")
		require.Contains(t, reason(t, sw, swHdr(swID, ts, swSig), swBody, tooEarly), "clock skew of -301 s")
	})
	t.Run("upper-case hex is the same MAC", func(t *testing.T) {
		// Decoded before comparing: hex case carries no information.
		require.Empty(t, reason(t, st, hdr("Stripe-Signature", "t="+ts+",v1="+strings.ToUpper(stSig)), stBody, vectorNow))
		gh := mustVerifier(t, Verify{Scheme: SchemeGitHub, Secrets: []string{ghSecret}})
		require.Empty(t, reason(t, gh, hdr("X-Hub-Signature-256", "sha256="+strings.ToUpper(ghSig[7:])), ghBody, vectorNow))
	})
	t.Run("stripe secret wrongly base64-decoded", func(t *testing.T) {
		key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix("whsec_dGVzdF9zZWNyZXQ=", "whsec_"))
		require.NoError(t, err)
		sig := hex.EncodeToString(hmacSHA256(key, []byte(ts+"."+stBody)))
		v := mustVerifier(t, Verify{Scheme: SchemeStripe, Secrets: []string{"whsec_dGVzdF9zZWNyZXQ="}})
		require.Equal(t, mismatch, reason(t, v, hdr("Stripe-Signature", "t="+ts+",v1="+sig), stBody, vectorNow))
	})
	t.Run("standard webhooks secret used undecoded", func(t *testing.T) {
		sig := "v1," + base64.StdEncoding.EncodeToString(hmacSHA256([]byte(swSecret), []byte(swID+"."+ts+"."+swBody)))
		require.Equal(t, mismatch, reason(t, sw, swHdr(swID, ts, sig), swBody, vectorNow))
	})
	t.Run("empty signature", func(t *testing.T) {
		require.Contains(t, reason(t, st, hdr("Stripe-Signature", ""), stBody, vectorNow), "missing")
		require.Contains(t, reason(t, st, hdr("Stripe-Signature", "t="+ts+",v1="), stBody, vectorNow), "malformed")
		require.Contains(t, reason(t, sw, swHdr(swID, ts, ""), swBody, vectorNow), "missing")
		require.Contains(t, reason(t, sw, swHdr(swID, ts, "v1,"), swBody, vectorNow), "malformed")
		gh := mustVerifier(t, Verify{Scheme: SchemeGitHub, Secrets: []string{ghSecret}})
		require.Contains(t, reason(t, gh, hdr("X-Hub-Signature-256", "sha256="), ghBody, vectorNow), "malformed")
	})
	t.Run("wrong secret", func(t *testing.T) {
		v := mustVerifier(t, Verify{Scheme: SchemeStripe, Secrets: []string{"whsec_other_secret_0001"}})
		require.Equal(t, mismatch, reason(t, v, hdr("Stripe-Signature", "t="+ts+",v1="+stSig), stBody, vectorNow))
	})
	t.Run("rotation", func(t *testing.T) {
		v := mustVerifier(t, Verify{Scheme: SchemeStripe, Secrets: []string{"whsec_new_rotated_secret", stSecret}})
		require.Empty(t, reason(t, v, hdr("Stripe-Signature", "t="+ts+",v1="+stSig), stBody, vectorNow))
	})
	t.Run("malformed timestamp", func(t *testing.T) {
		require.Contains(t, reason(t, sw, swHdr(swID, "soon", swSig), swBody, vectorNow), "malformed")
	})
}

func TestStandardWebhooksEd25519(t *testing.T) {
	t.Parallel()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	v := mustVerifier(t, Verify{Scheme: SchemeStandardWebhooks, PublicKeys: []string{"whpk_" + base64.StdEncoding.EncodeToString(pub)}})
	ts := strconv.Itoa(vectorTS)
	sig := ed25519.Sign(priv, []byte(swID+"."+ts+"."+swBody))
	require.Empty(t, reason(t, v, swHdr(swID, ts, "v1a,"+base64.StdEncoding.EncodeToString(sig)), swBody, vectorNow))
	require.NotEmpty(t, reason(t, v, swHdr(swID, ts, "v1a,"+base64.StdEncoding.EncodeToString(sig)), swBody+" ", vectorNow))
}

func TestBearer(t *testing.T) {
	t.Parallel()
	v := mustVerifier(t, Verify{Scheme: SchemeBearer, Tokens: map[string]string{"token-a-0123456789": "a", "token-b-0123456789": "b"}})
	tenant, err := v.verify(hdr("Authorization", "Bearer token-b-0123456789"), nil, time.Now())
	require.NoError(t, err)
	require.Equal(t, "b", tenant)
	require.Equal(t, "unknown bearer token", reason(t, v, hdr("Authorization", "Bearer token-c-0123456789"), "", time.Now()))
	require.Contains(t, reason(t, v, hdr(), "", time.Now()), "missing")
	tokens, err := ParseTokens("ta=a, tb=b")
	require.NoError(t, err)
	require.Equal(t, map[string]string{"ta": "a", "tb": "b"}, tokens)
	_, err = ParseTokens("nope")
	require.Error(t, err)
}

func TestNewVerifierErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		v     Verify
		allow bool
		want  string
	}{
		{Verify{Scheme: "none"}, false, "allow_unverified"},
		{Verify{Scheme: "rot13"}, false, "unknown"},
		{Verify{}, false, "verify.scheme is required"},
		{Verify{Scheme: "stripe"}, false, "verify.secrets"},
		{Verify{Scheme: "standard-webhooks", Secrets: []string{"whsec_!!"}}, false, "verify.secrets[0]"},
		{Verify{Scheme: "hmac-sha256", Secrets: []string{"s-0123456789abcdef"}}, false, "verify.header"},
		{Verify{Scheme: "bearer"}, false, "verify.tokens"},
	} {
		_, err := newVerifier(tc.v, tc.allow)
		require.ErrorContains(t, err, tc.want)
	}
	_, err := newVerifier(Verify{Scheme: "none"}, true)
	require.NoError(t, err)
}

func FuzzStripeHeader(f *testing.F) {
	f.Add("t=1614265330,v1=" + stSig)
	f.Add("t=1,v0=00,v1=zz,v1=" + stSig)
	f.Add("")
	f.Add("t=,v1=")
	f.Add(",,,=")
	v := stripeVerifier{keys: [][]byte{[]byte(stSecret)}, tol: ToleranceDefault}
	f.Fuzz(func(t *testing.T, s string) {
		h, err := parseStripeHeader(s)
		if err == nil && h.t == "" {
			t.Fatal("parsed a header without timestamp")
		}
		// Never panics, never accepts what it cannot verify.
		if _, err := v.verify(hdr("Stripe-Signature", s), []byte(stBody), vectorNow); err == nil && !strings.Contains(s, stSig) && !strings.Contains(strings.ToLower(s), stSig) {
			t.Fatalf("accepted %q", s)
		}
	})
}

func FuzzStandardSignatures(f *testing.F) {
	f.Add(swSig)
	f.Add("v1,Zm9v " + swSig)
	f.Add("v1a,AAAA")
	f.Add("")
	f.Add(",,, v1")
	v := standardVerifier{keys: [][]byte{mustDecode(f, swSecret)}, tol: ToleranceDefault}
	f.Fuzz(func(t *testing.T, s string) {
		_, _ = parseStandardSignatures(s)
		if _, err := v.verify(swHdr(swID, strconv.Itoa(vectorTS), s), []byte(swBody), vectorNow); err == nil && !strings.Contains(s, swSig[3:]) {
			t.Fatalf("accepted %q", s)
		}
	})
}

func FuzzBodySignature(f *testing.F) {
	f.Add(ghSig, "sha256=", false)
	f.Add(shopSig, "", true)
	f.Add("", "", false)
	f.Add("sha256=ZZ", "sha256=", false)
	f.Fuzz(func(t *testing.T, s, prefix string, b64 bool) {
		b, err := parseBodySignature(s, prefix, b64)
		if err == nil && len(b) != 32 {
			t.Fatalf("accepted a %d-byte MAC", len(b))
		}
	})
}

func mustDecode(tb testing.TB, s string) []byte {
	b, err := signkey.DecodeStandard(s)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// TestShortKeysRefused: a key that decodes to fewer than 16 bytes, an empty one above all
// (standard-webhooks "whsec_"), would let anyone forge requests: New refuses it for every
// scheme, and bearer tokens likewise.
func TestShortKeysRefused(t *testing.T) {
	t.Parallel()
	short := "fifteen-bytes!!"
	for _, v := range []Verify{
		{Scheme: SchemeStripe, Secrets: []string{""}},
		{Scheme: SchemeStripe, Secrets: []string{stSecret, short}},
		{Scheme: SchemeStandardWebhooks, Secrets: []string{"whsec_"}},
		{Scheme: SchemeStandardWebhooks, Secrets: []string{"whsec_" + base64.StdEncoding.EncodeToString([]byte(short))}},
		{Scheme: SchemeGitHub, Secrets: []string{short}},
		{Scheme: SchemeShopify, Secrets: []string{shopSecret}},
		{Scheme: SchemeSlack, Secrets: []string{""}},
		{Scheme: SchemeHMACSHA256, Secrets: []string{short}, Header: "X-Sig"},
		{Scheme: SchemeBearer, Tokens: map[string]string{short: "a"}},
	} {
		_, err := newVerifier(v, false)
		require.ErrorContains(t, err, "shorter than 16 bytes", "%s", v.Scheme)
		require.NotContains(t, err.Error(), short)
		require.Error(t, CheckSecret(v.Scheme, short))
	}
	require.Error(t, CheckSecret(SchemeStandardWebhooks, "whsec_"))
	for _, v := range []Verify{
		{Scheme: SchemeStripe, Secrets: []string{short + "!"}},
		{Scheme: SchemeStandardWebhooks, Secrets: []string{"whsec_" + base64.StdEncoding.EncodeToString([]byte(short+"!"))}},
		{Scheme: SchemeBearer, Tokens: map[string]string{short + "!": "a"}},
	} {
		_, err := newVerifier(v, false)
		require.NoError(t, err, "%s: 16 bytes are enough", v.Scheme)
	}
}

// TestHeaderIDOnHMACIsOptIn: an hmac-sha256 signature covers the body only, so a header id
// is not authenticated (a captured request replays with a fresh id). New refuses it unless
// AllowUnsignedMessageID says so, and refuses that flag where it means nothing.
func TestHeaderIDOnHMACIsOptIn(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWithOptions(t, pgtest.Options{MaxConns: 2})
	v := Verify{Scheme: SchemeHMACSHA256, Secrets: []string{ghSecret}, Header: "X-Sig"}
	newWith := func(s Source) error {
		s.Name = "x"
		r, err := New(db.Pool, &Config{Schema: db.Schema, Sources: []Source{s}})
		if err == nil {
			r.Close()
		}
		return err
	}
	err := newWith(Source{Verify: v, MessageID: &pipeline.Field{Header: "X-Id"}})
	require.ErrorIs(t, err, ErrUnsignedMessageID)
	require.ErrorContains(t, err, `source 0 ("x"): message_id.header: `)
	require.NoError(t, newWith(Source{Verify: v, MessageID: &pipeline.Field{Header: "X-Id"}, AllowUnsignedMessageID: true}))
	require.NoError(t, newWith(Source{Verify: v, MessageID: &pipeline.Field{JSON: "/id"}}), "an id inside the signed body")
	require.ErrorIs(t, newWith(Source{Verify: v, MessageID: &pipeline.Field{JSON: "/id"}, AllowUnsignedMessageID: true}), ErrUnsignedMessageIDUnused)
	require.ErrorIs(t, newWith(Source{Verify: Verify{Scheme: SchemeGitHub, Secrets: []string{ghSecret}}, AllowUnsignedMessageID: true}), ErrUnsignedMessageIDUnused)
}

// TestStandardSignaturesCapped: each v1a entry costs an Ed25519 verification that hashes the
// whole body, against every public key. A header of hundreds of junk entries (694 took
// 872 ms with a 1 MiB body) is refused before any hashing; up to MaxSignatures entries are
// still tried, a valid one last included, as is a v1 signature among v1a junk.
func TestStandardSignaturesCapped(t *testing.T) {
	t.Parallel()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	v := mustVerifier(t, Verify{Scheme: SchemeStandardWebhooks, Secrets: []string{swSecret},
		PublicKeys: []string{"whpk_" + base64.StdEncoding.EncodeToString(pub)}})
	ts := strconv.Itoa(vectorTS)
	junk := "v1a," + base64.StdEncoding.EncodeToString(make([]byte, ed25519.SignatureSize))
	good := "v1a," + base64.StdEncoding.EncodeToString(ed25519.Sign(priv, []byte(swID+"."+ts+"."+swBody)))

	many := strings.TrimSpace(strings.Repeat(junk+" ", 694))
	require.Equal(t, "malformed header: more than 5 signatures in webhook-signature", reason(t, v, swHdr(swID, ts, many+" "+good), swBody, vectorNow))
	sixth := strings.Repeat(junk+" ", MaxSignatures) + good
	require.Contains(t, reason(t, v, swHdr(swID, ts, sixth), swBody, vectorNow), "more than 5 signatures")

	require.Empty(t, reason(t, v, swHdr(swID, ts, strings.Repeat(junk+" ", MaxSignatures-1)+good), swBody, vectorNow))
	require.Empty(t, reason(t, v, swHdr(swID, ts, junk+" "+junk+" "+swSig), swBody, vectorNow), "v1 among v1a junk")
	require.Equal(t, "signature does not match (wrong secret or body altered)",
		reason(t, v, swHdr(swID, ts, strings.TrimSpace(strings.Repeat(junk+" ", MaxSignatures))), swBody, vectorNow))
}

// BenchmarkStandardV1aWorstCase: the most a request can cost the Ed25519 path with a 1 MiB
// body (MaxSignatures distinct junk entries, one public key). Before the cap, 694 entries
// cost 694 hashes of the body.
func BenchmarkStandardV1aWorstCase(b *testing.B) {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(b, err)
	v := standardVerifier{pubKeys: []ed25519.PublicKey{pub}, tol: ToleranceDefault}
	var entries []string
	for i := range MaxSignatures {
		sig := make([]byte, ed25519.SignatureSize)
		sig[0] = byte(i + 1)
		entries = append(entries, "v1a,"+base64.StdEncoding.EncodeToString(sig))
	}
	h := swHdr(swID, strconv.Itoa(vectorTS), strings.Join(entries, " "))
	body := make([]byte, 1<<20)
	b.ResetTimer()
	for b.Loop() {
		if _, err := v.verify(h, body, vectorNow); err == nil {
			b.Fatal("junk verified")
		}
	}
}

// TestTimestampFarAway: a timestamp 292 years ahead made the skew overflow time.Duration
// (skew × 1 s wrapped negative) and passed the tolerance; so did one 584 years ahead, which
// wraps to 0.29 s. Timestamps at the ends of int64 must not overflow either.
func TestTimestampFarAway(t *testing.T) {
	t.Parallel()
	now := vectorNow.Unix()
	for _, ts := range []int64{now + 9223372037, now + 18446744074, now + 301, now - 301, math.MaxInt64, math.MinInt64, math.MinInt64 + 1, -now} {
		_, err := checkTimestamp(strconv.FormatInt(ts, 10), ToleranceDefault, vectorNow)
		require.ErrorContains(t, err, "exceeds the tolerance of 300 s", "%d", ts)
	}
	for _, ts := range []int64{now, now + 300, now - 300} {
		_, err := checkTimestamp(strconv.FormatInt(ts, 10), ToleranceDefault, vectorNow)
		require.NoError(t, err)
	}
	_, err := checkTimestamp(strconv.FormatInt(math.MinInt64, 10), ToleranceDefault, vectorNow)
	require.ErrorContains(t, err, "clock skew of 9223372038469041138 s")
	_, err = checkTimestamp(strconv.FormatInt(now+9223372037, 10), ToleranceDefault, vectorNow)
	require.ErrorContains(t, err, "clock skew of -9223372037 s")
}

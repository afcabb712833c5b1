package receiver

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemd/idemd/internal/signkey"
)

// Verification schemes (Verify.Scheme).
const (
	SchemeStripe           = "stripe"
	SchemeStandardWebhooks = "standard-webhooks"
	SchemeGitHub           = "github"
	SchemeShopify          = "shopify"
	SchemeSlack            = "slack"
	SchemeHMACSHA256       = "hmac-sha256"
	SchemeBearer           = "bearer"
	SchemeNone             = "none"
)

// The headers that carry the signatures of the schemes that fix their names.
const (
	HeaderStripeSignature  = "Stripe-Signature"
	HeaderWebhookID        = "Webhook-Id"
	HeaderWebhookTimestamp = "Webhook-Timestamp"
	HeaderWebhookSignature = "Webhook-Signature"
	HeaderGitHubSignature  = "X-Hub-Signature-256"
	HeaderShopifySignature = "X-Shopify-Hmac-Sha256"
	HeaderSlackSignature   = "X-Slack-Signature"
	HeaderSlackTimestamp   = "X-Slack-Request-Timestamp"
)

// SignatureHeaders are the headers a request to a source of v must carry: the signature's
// first (the configured one for hmac-sha256, Authorization for bearer), then what it signs
// besides the body (standard-webhooks' id and timestamp, Slack's timestamp). None for
// scheme none. Standard-webhooks also takes the same headers named svix-*.
func (v Verify) SignatureHeaders() []string {
	switch v.Scheme {
	case SchemeStripe:
		return []string{HeaderStripeSignature}
	case SchemeStandardWebhooks:
		return []string{HeaderWebhookSignature, HeaderWebhookID, HeaderWebhookTimestamp}
	case SchemeGitHub:
		return []string{HeaderGitHubSignature}
	case SchemeShopify:
		return []string{HeaderShopifySignature}
	case SchemeSlack:
		return []string{HeaderSlackSignature, HeaderSlackTimestamp}
	case SchemeHMACSHA256:
		return []string{v.Header}
	case SchemeBearer:
		return []string{"Authorization"}
	}
	return nil
}

// ToleranceDefault is how far a signed timestamp may be from the receiver's clock, in either
// direction.
const ToleranceDefault = 300 * time.Second

// verifyError says why a request failed verification. Its message goes to the log only:
// the response says "invalid signature" whatever the reason, so that a prober learns
// nothing. It never contains a secret or a signature.
type verifyError struct{ reason string }

func (e *verifyError) Error() string { return e.reason }

func failf(format string, args ...any) error { return &verifyError{fmt.Sprintf(format, args...)} }

// errMismatch covers a wrong secret and an altered body alike: an HMAC cannot tell them apart.
var errMismatch = &verifyError{"signature does not match (wrong secret or body altered)"}

// verifier checks one request's raw body and headers and returns the tenant it belongs to
// ("" for webhooks). now is injected for tests.
type verifier interface {
	verify(h http.Header, body []byte, now time.Time) (tenant string, err error)
}

func hmacSHA256(key []byte, parts ...[]byte) []byte {
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		m.Write(p)
	}
	return m.Sum(nil)
}

// anyMAC reports whether any candidate equals the MAC of parts under any key, comparing every
// pair in constant time (no early exit that would reveal which secret or position matched).
func anyMAC(keys [][]byte, candidates [][]byte, parts ...[]byte) bool {
	ok := 0
	for _, k := range keys {
		want := hmacSHA256(k, parts...)
		for _, c := range candidates {
			ok |= subtle.ConstantTimeCompare(want, c)
		}
	}
	return ok == 1
}

// parseTimestamp checks a signed timestamp's format, before the signature, so that the log
// says "malformed" rather than "does not match" for it.
func parseTimestamp(ts string) error {
	if _, err := strconv.ParseInt(strings.TrimSpace(ts), 10, 64); err != nil {
		return failf("malformed header: timestamp %q is not an integer", truncate(ts, 20))
	}
	return nil
}

// checkTimestamp checks that the signed Unix time ts is within tol of now, both ways. The
// comparison is in seconds against bounds computed from now: now - ts overflows int64 for
// a timestamp near either end of its range, and seconds as a time.Duration overflow after
// 292 years (a timestamp that far ahead used to pass as a negative skew).
func checkTimestamp(ts string, tol time.Duration, now time.Time) (int64, error) {
	t, err := strconv.ParseInt(strings.TrimSpace(ts), 10, 64)
	if err != nil {
		return 0, parseTimestamp(ts)
	}
	n, tolS := now.Unix(), int64(tol/time.Second)
	if t < n-tolS || t > n+tolS {
		// now - t, exactly, for the log: as unsigned, the difference cannot wrap.
		skew := strconv.FormatUint(uint64(n)-uint64(t), 10)
		if t > n {
			skew = "-" + strconv.FormatUint(uint64(t)-uint64(n), 10)
		}
		return 0, failf("clock skew of %s s exceeds the tolerance of %d s", skew, tolS)
	}
	return t, nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// --- stripe ---------------------------------------------------------------------------

type stripeVerifier struct {
	keys [][]byte
	tol  time.Duration
}

// stripeHeader is a parsed Stripe-Signature header.
type stripeHeader struct {
	t      string
	v1     [][]byte
	sawV0  bool
	badHex int
}

// parseStripeHeader parses "t=…,v1=<hex>,v1=<hex>,v0=…". Unknown schemes are ignored, as
// Stripe asks, so that a new scheme does not break old receivers.
func parseStripeHeader(s string) (stripeHeader, error) {
	var h stripeHeader
	if strings.TrimSpace(s) == "" {
		return h, failf("missing or empty Stripe-Signature header")
	}
	for _, item := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok {
			return h, failf("malformed header: Stripe-Signature item without '='")
		}
		switch k {
		case "t":
			if h.t != "" {
				return h, failf("malformed header: Stripe-Signature has two timestamps")
			}
			h.t = v
		case "v1":
			b, err := hex.DecodeString(v)
			if err != nil || len(b) != sha256.Size {
				h.badHex++
				continue
			}
			h.v1 = append(h.v1, b)
		case "v0":
			h.sawV0 = true
		}
	}
	if h.t == "" {
		return h, failf("malformed header: Stripe-Signature has no timestamp")
	}
	return h, nil
}

func (v stripeVerifier) verify(hd http.Header, body []byte, now time.Time) (string, error) {
	h, err := parseStripeHeader(hd.Get(HeaderStripeSignature))
	if err != nil {
		return "", err
	}
	if len(h.v1) == 0 {
		switch {
		case h.sawV0:
			return "", failf("only v0 signatures present (v0 is Stripe's test scheme; v1 is required)")
		case h.badHex > 0:
			return "", failf("malformed header: v1 signature is not 64 hex digits")
		default:
			return "", failf("malformed header: no v1 signature")
		}
	}
	if err := parseTimestamp(h.t); err != nil {
		return "", err
	}
	if !anyMAC(v.keys, h.v1, []byte(h.t), []byte("."), body) {
		return "", errMismatch
	}
	if _, err := checkTimestamp(h.t, v.tol, now); err != nil {
		return "", err
	}
	return "", nil
}

// --- standard webhooks (Svix) ---------------------------------------------------------

type standardVerifier struct {
	keys    [][]byte
	pubKeys []ed25519.PublicKey
	tol     time.Duration
}

// swHeaders returns id, timestamp and signature, from the webhook-* names or else svix-*.
func swHeaders(h http.Header) (id, ts, sig string) {
	id, ts, sig = h.Get(HeaderWebhookID), h.Get(HeaderWebhookTimestamp), h.Get(HeaderWebhookSignature)
	if id == "" && ts == "" && sig == "" {
		id, ts, sig = h.Get("Svix-Id"), h.Get("Svix-Timestamp"), h.Get("Svix-Signature")
	}
	return id, ts, sig
}

// MaxSignatures is how many entries one webhook-signature header may carry. Senders send one
// per active secret (two while rotating); each v1a entry costs an Ed25519 verification that
// hashes the whole body, so a header of hundreds of entries would cost hundreds of hashes.
const MaxSignatures = 5

// swSignatures is a parsed webhook-signature header: "v1,<b64> v1,<b64> v1a,<b64>".
type swSignatures struct {
	v1, v1a [][]byte
}

func parseStandardSignatures(s string) (swSignatures, error) {
	var out swSignatures
	if strings.TrimSpace(s) == "" {
		return out, failf("missing or empty webhook-signature header")
	}
	items := strings.Fields(s)
	if len(items) > MaxSignatures {
		return out, failf("malformed header: more than %d signatures in webhook-signature", MaxSignatures)
	}
	seen := map[[ed25519.SignatureSize]byte]bool{}
	for _, item := range items {
		ver, sig, ok := strings.Cut(item, ",")
		if !ok {
			return out, failf("malformed header: webhook-signature entry without a version")
		}
		b, err := base64.StdEncoding.DecodeString(sig)
		switch {
		case err != nil:
			// One bad entry must not hide a good one beside it.
		case ver == "v1" && len(b) == sha256.Size:
			out.v1 = append(out.v1, b)
		case ver == "v1a" && len(b) == ed25519.SignatureSize:
			// A repeated entry is verified once.
			if !seen[[ed25519.SignatureSize]byte(b)] {
				seen[[ed25519.SignatureSize]byte(b)] = true
				out.v1a = append(out.v1a, b)
			}
		}
	}
	if len(out.v1) == 0 && len(out.v1a) == 0 {
		return out, failf("malformed header: no decodable v1 or v1a signature")
	}
	return out, nil
}

func (v standardVerifier) verify(h http.Header, body []byte, now time.Time) (string, error) {
	id, ts, sig := swHeaders(h)
	if id == "" || ts == "" {
		return "", failf("missing webhook-id or webhook-timestamp header")
	}
	sigs, err := parseStandardSignatures(sig)
	if err != nil {
		return "", err
	}
	if err := parseTimestamp(ts); err != nil {
		return "", err
	}
	ok := anyMAC(v.keys, sigs.v1, []byte(id), []byte("."), []byte(ts), []byte("."), body)
	if !ok && len(sigs.v1a) > 0 && len(v.pubKeys) > 0 {
		// Ed25519 hashes the message again for every (key, signature) pair: the content is
		// built once, and at most MaxSignatures × keys verifications run, none once one passed.
		// Public keys hold no secret, so stopping early reveals nothing.
		content := make([]byte, 0, len(id)+len(ts)+len(body)+2)
		content = append(append(append(append(append(content, id...), '.'), ts...), '.'), body...)
	verify:
		for _, pk := range v.pubKeys {
			for _, s := range sigs.v1a {
				if ed25519.Verify(pk, content, s) {
					ok = true
					break verify
				}
			}
		}
	}
	if !ok {
		return "", errMismatch
	}
	if _, err := checkTimestamp(ts, v.tol, now); err != nil {
		return "", err
	}
	return "", nil
}

// decodeStandardPublicKey turns "whpk_<base64>" into an Ed25519 public key (v1a).
func decodeStandardPublicKey(s string) (ed25519.PublicKey, error) {
	b, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, "whpk_"))
	if err != nil || len(b) != ed25519.PublicKeySize {
		return nil, errors.New("a standard-webhooks public key is whpk_ followed by 32 base64-encoded bytes")
	}
	return ed25519.PublicKey(b), nil
}

// --- generic HMAC over the body (github, shopify, hmac-sha256) ---------------------------

type bodyHMACVerifier struct {
	keys   [][]byte
	header string
	prefix string
	base64 bool
}

// parseBodySignature decodes one "<prefix><hex|base64>" header value.
func parseBodySignature(s, prefix string, b64 bool) ([]byte, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, failf("missing or empty signature header")
	}
	if prefix != "" {
		if !strings.HasPrefix(s, prefix) {
			return nil, failf("malformed header: signature does not start with %q", prefix)
		}
		s = s[len(prefix):]
	}
	var (
		b   []byte
		err error
	)
	if b64 {
		b, err = base64.StdEncoding.DecodeString(s)
	} else {
		b, err = hex.DecodeString(s)
	}
	if err != nil || len(b) != sha256.Size {
		return nil, failf("malformed header: signature is not a %s SHA-256 MAC", map[bool]string{true: "base64", false: "hex"}[b64])
	}
	return b, nil
}

func (v bodyHMACVerifier) verify(h http.Header, body []byte, _ time.Time) (string, error) {
	sig, err := parseBodySignature(h.Get(v.header), v.prefix, v.base64)
	if err != nil {
		return "", err
	}
	if !anyMAC(v.keys, [][]byte{sig}, body) {
		return "", errMismatch
	}
	return "", nil
}

// --- slack ----------------------------------------------------------------------------

type slackVerifier struct {
	keys [][]byte
	tol  time.Duration
}

func (v slackVerifier) verify(h http.Header, body []byte, now time.Time) (string, error) {
	ts := h.Get(HeaderSlackTimestamp)
	if ts == "" {
		return "", failf("missing X-Slack-Request-Timestamp header")
	}
	if err := parseTimestamp(ts); err != nil {
		return "", err
	}
	sig, err := parseBodySignature(h.Get(HeaderSlackSignature), "v0=", false)
	if err != nil {
		return "", err
	}
	if !anyMAC(v.keys, [][]byte{sig}, []byte("v0:"+ts+":"), body) {
		return "", errMismatch
	}
	if _, err := checkTimestamp(ts, v.tol, now); err != nil {
		return "", err
	}
	return "", nil
}

// --- bearer ---------------------------------------------------------------------------

// bearerVerifier keeps the SHA-256 of each token, not the token: comparing digests of
// fixed length takes the same time whatever the length of the token sent.
type bearerVerifier struct {
	tokens []bearerToken
}

type bearerToken struct {
	digest [sha256.Size]byte
	tenant string
}

func (v bearerVerifier) verify(h http.Header, _ []byte, _ time.Time) (string, error) {
	auth := h.Get("Authorization")
	scheme, tok, ok := strings.Cut(auth, " ")
	if auth == "" {
		return "", failf("missing Authorization header")
	}
	if !ok || !strings.EqualFold(scheme, "Bearer") || tok == "" {
		return "", failf("malformed header: Authorization is not \"Bearer <token>\"")
	}
	sent := sha256.Sum256([]byte(tok))
	tenant, found := "", 0
	for _, t := range v.tokens {
		// Compare against every token: the time taken does not say which one matched, nor
		// (digests of one length) how long the right token is.
		if subtle.ConstantTimeCompare(t.digest[:], sent[:]) == 1 {
			tenant, found = t.tenant, 1
		}
	}
	if found == 0 {
		return "", failf("unknown bearer token")
	}
	return tenant, nil
}

type noneVerifier struct{}

func (noneVerifier) verify(http.Header, []byte, time.Time) (string, error) { return "", nil }

// ParseTokens parses the bearer scheme's "token=tenant,token2=tenant2" list (the value of the
// environment variable named by tokens_env) into Verify.Tokens. Every malformed entry is
// reported, and the well-formed ones are returned beside the error, so that a caller can
// report their problems too (a token too short) in the same run.
func ParseTokens(s string) (map[string]string, error) {
	out := map[string]string{}
	var errs []error
	for i, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		tok, tenant, ok := strings.Cut(item, "=")
		if !ok || tok == "" || tenant == "" {
			errs = append(errs, fmt.Errorf("token list entry %d is not token=tenant", i+1))
			continue
		}
		out[tok] = tenant
	}
	if len(out) == 0 && len(errs) == 0 {
		return nil, errors.New("token list is empty")
	}
	return out, errors.Join(errs...)
}

// CheckSecret reports whether secret is a usable signing secret of scheme: decoded as the
// scheme decodes it (standard-webhooks: base64 after "whsec_"; the others: the bytes as
// they are), it must hold at least 16 bytes (internal/signkey). A bearer token is checked
// the same way. The error never contains the secret.
func CheckSecret(scheme, secret string) error {
	if scheme == SchemeStandardWebhooks {
		_, err := signkey.DecodeStandard(secret)
		return err
	}
	return signkey.Check([]byte(secret))
}

// ErrUnsignedMessageID refuses a header message id on a body-only hmac-sha256 source unless
// Source.AllowUnsignedMessageID (allow_unsigned_message_id) says the operator accepts it.
var ErrUnsignedMessageID = errors.New("the hmac-sha256 signature covers the body only, so a header id is not " +
	"authenticated and a captured request can be sent again with a new id: use message_id.json (an id inside the " +
	"signed body), or set allow_unsigned_message_id: true (AllowUnsignedMessageID) to accept that")

// ErrUnsignedMessageIDUnused refuses AllowUnsignedMessageID where it has no meaning.
var ErrUnsignedMessageIDUnused = errors.New("only for verify.scheme hmac-sha256 with message_id.header")

// checkMessageID enforces AllowUnsignedMessageID: a header id on an hmac-sha256 source is
// an explicit opt-in, and the opt-in means nothing elsewhere.
func checkMessageID(s Source) error {
	headerID := s.Verify.Scheme == SchemeHMACSHA256 && s.MessageID != nil && s.MessageID.UsesHeader()
	switch {
	case headerID && !s.AllowUnsignedMessageID:
		return fmt.Errorf("message_id.header: %w", ErrUnsignedMessageID)
	case !headerID && s.AllowUnsignedMessageID:
		return fmt.Errorf("allow_unsigned_message_id: %w", ErrUnsignedMessageIDUnused)
	}
	return nil
}

// newVerifier builds the verifier of v, or says which field is wrong.
func newVerifier(v Verify, allowUnverified bool) (verifier, error) {
	raw := func() ([][]byte, error) {
		if len(v.Secrets) == 0 {
			return nil, errors.New("verify.secrets: at least one secret is required")
		}
		keys := make([][]byte, 0, len(v.Secrets))
		for i, s := range v.Secrets {
			if err := signkey.Check([]byte(s)); err != nil {
				return nil, fmt.Errorf("verify.secrets[%d]: %w", i, err)
			}
			keys = append(keys, []byte(s))
		}
		return keys, nil
	}
	tol := v.Tolerance
	if tol == 0 {
		tol = ToleranceDefault
	}
	if tol < 0 {
		return nil, fmt.Errorf("verify.tolerance must not be negative, got %s", v.Tolerance)
	}
	switch v.Scheme {
	case SchemeStripe:
		keys, err := raw()
		if err != nil {
			return nil, err
		}
		return stripeVerifier{keys: keys, tol: tol}, nil
	case SchemeStandardWebhooks:
		sv := standardVerifier{tol: tol}
		for i, s := range v.Secrets {
			k, err := signkey.DecodeStandard(s)
			if err != nil {
				return nil, fmt.Errorf("verify.secrets[%d]: %w", i, err)
			}
			sv.keys = append(sv.keys, k)
		}
		for i, s := range v.PublicKeys {
			k, err := decodeStandardPublicKey(s)
			if err != nil {
				return nil, fmt.Errorf("verify.public_keys[%d]: %w", i, err)
			}
			sv.pubKeys = append(sv.pubKeys, k)
		}
		if len(sv.keys) == 0 && len(sv.pubKeys) == 0 {
			return nil, errors.New("verify.secrets: at least one secret (or public key) is required")
		}
		return sv, nil
	case SchemeGitHub:
		keys, err := raw()
		if err != nil {
			return nil, err
		}
		return bodyHMACVerifier{keys: keys, header: HeaderGitHubSignature, prefix: "sha256="}, nil
	case SchemeShopify:
		keys, err := raw()
		if err != nil {
			return nil, err
		}
		return bodyHMACVerifier{keys: keys, header: HeaderShopifySignature, base64: true}, nil
	case SchemeSlack:
		keys, err := raw()
		if err != nil {
			return nil, err
		}
		return slackVerifier{keys: keys, tol: tol}, nil
	case SchemeHMACSHA256:
		keys, err := raw()
		if err != nil {
			return nil, err
		}
		if v.Header == "" {
			return nil, errors.New("verify.header is required for hmac-sha256")
		}
		var b64 bool
		switch v.Encoding {
		case "", "hex":
		case "base64":
			b64 = true
		default:
			return nil, fmt.Errorf("verify.encoding must be hex or base64, got %q", v.Encoding)
		}
		return bodyHMACVerifier{keys: keys, header: v.Header, prefix: v.Prefix, base64: b64}, nil
	case SchemeBearer:
		if len(v.Tokens) == 0 {
			return nil, errors.New("verify.tokens: at least one token=tenant is required")
		}
		bv := bearerVerifier{}
		for _, tok := range slices.Sorted(maps.Keys(v.Tokens)) {
			tenant := v.Tokens[tok]
			if tok == "" || tenant == "" {
				return nil, errors.New("verify.tokens: empty token or tenant")
			}
			if err := signkey.Check([]byte(tok)); err != nil {
				return nil, fmt.Errorf("verify.tokens: the token of tenant %q: %w", tenant, err)
			}
			bv.tokens = append(bv.tokens, bearerToken{digest: sha256.Sum256([]byte(tok)), tenant: tenant})
		}
		return bv, nil
	case SchemeNone:
		if !allowUnverified {
			return nil, errors.New("verify.scheme none is refused unless allow_unverified is true")
		}
		return noneVerifier{}, nil
	case "":
		return nil, errors.New("verify.scheme is required")
	default:
		return nil, fmt.Errorf("verify.scheme %q is unknown (want stripe, standard-webhooks, github, shopify, slack, hmac-sha256, bearer or none)", v.Scheme)
	}
}

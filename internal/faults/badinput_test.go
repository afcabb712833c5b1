package faults

import (
	"bufio"
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Secrets of the bad-input daemon. Every one of them, every token and every signature
// computed with them is searched for in the daemon's logs and in every response.
var (
	biStripe  = "whsec_bad_input_stripe_91b2c7"
	biGitHub  = "gh-secret-5d1c0e77"
	biShopify = "shpss_4c9f2a61d0"
	biSWKey   = []byte("sw-secret-bytes-7e2a90c4")
	biSW      = "whsec_" + base64.StdEncoding.EncodeToString(biSWKey)
	biSlack   = "slack-signing-3a8b5f10"
	biHMAC    = "hmac-secret-0f6d2e93"
	biTokA    = "tokA-8c1f2e0b9d77a1"
	biTokB    = "tokB-77d0a1c3e5f2b8"
)

// badInputDDL: effect tables of every source.
const badInputDDL = effectsDDL + `;
CREATE TABLE {s}.orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, tenant text NOT NULL, body text NOT NULL)`

// badInputNode runs a receiver with one source per verification scheme, logging at trace.
func badInputNode(t *testing.T, d *db, extra map[string]string) *node {
	t.Helper()
	eff := fmt.Sprintf(`{sql: "INSERT INTO %s.effects (message_id, applied_by) VALUES (@message_id, @source)"}`, d.schema)
	file := writeFile(t, fmt.Sprintf(`sources:
  - name: stripe
    verify: {scheme: stripe, secrets_env: [BI_STRIPE]}
    effect: %[1]s
    publish: {topic: bi.stripe, key: {json: /id}}
  - name: github
    verify: {scheme: github, secrets_env: [BI_GITHUB]}
    effect: %[1]s
  - name: shopify
    verify: {scheme: shopify, secrets_env: [BI_SHOPIFY]}
    effect: %[1]s
  - name: sw
    verify: {scheme: standard-webhooks, secrets_env: [BI_SW]}
    effect: %[1]s
  - name: slack
    verify: {scheme: slack, secrets_env: [BI_SLACK]}
    effect: %[1]s
  - name: generic
    verify: {scheme: hmac-sha256, secrets_env: [BI_HMAC], header: X-Signature, encoding: base64}
    message_id: {header: X-Id}
    allow_unsigned_message_id: true
    effect: %[1]s
  - name: orders
    path: /v1/orders
    verify: {scheme: bearer, tokens_env: BI_TOKENS}
    idempotency: {required: true}
    effect: {sql: "INSERT INTO %[2]s.orders (tenant, body) VALUES (@tenant, @payload) RETURNING id, tenant", status: 201}
`, eff, d.schema))
	vars := map[string]string{
		"BI_STRIPE": biStripe, "BI_GITHUB": biGitHub, "BI_SHOPIFY": biShopify, "BI_SW": biSW,
		"BI_SLACK": biSlack, "BI_HMAC": biHMAC, "BI_TOKENS": biTokA + "=tenant-a," + biTokB + "=tenant-b",
		"IDEMD_LOG_LEVEL": "trace",
	}
	for k, v := range extra {
		vars[k] = v
	}
	return newNode(t, d.schema, file, "receiver", nil, vars)
}

func macHex(key, msg string) string {
	m := hmac.New(sha256.New, []byte(key))
	m.Write([]byte(msg))
	return hex.EncodeToString(m.Sum(nil))
}

func macB64(key []byte, msg string, enc *base64.Encoding) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(msg))
	return enc.EncodeToString(m.Sum(nil))
}

// sent records every signature value the catalogue computed, for the leak scan.
var sent struct {
	sync.Mutex
	sigs []string
}

func remember(sig string) string {
	sent.Lock()
	defer sent.Unlock()
	sent.sigs = append(sent.sigs, sig)
	return sig
}

// badCase is one hostile request: either an *http.Request or raw bytes on a connection.
type badCase struct {
	name string
	req  func(base string) *http.Request
	raw  func() []byte
	want int
	// effects is how many effect rows (and processed records) the case may add: a hostile
	// but valid request (an id that looks like SQL) is processed once, as data.
	effects int
	orders  int
	// bug, when set, skips the case: it names a known bug the case found.
	bug string
}

func post(path string, body []byte, hdr ...string) func(string) *http.Request {
	return func(base string) *http.Request {
		r, err := http.NewRequest(http.MethodPost, base+path, bytes.NewReader(body))
		if err != nil {
			panic(err)
		}
		r.Header.Set("Content-Type", "application/json")
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Header.Add(hdr[i], hdr[i+1])
		}
		return r
	}
}

func with(method string, f func(string) *http.Request) func(string) *http.Request {
	return func(base string) *http.Request {
		r := f(base)
		r.Method = method
		return r
	}
}

func evt(id string) []byte {
	b, _ := json.Marshal(map[string]any{"id": id, "object": "event", "type": "charge.succeeded"})
	return b
}

func stripeSig(body []byte, ts int64) string {
	return remember(stripeSign(biStripe, ts, body))
}

// catalogue is the list of hostile requests, each with its expected status.
func catalogue() []badCase {
	now := time.Now().Unix()
	good := evt("evt_bi_good")
	ghBody := []byte(`{"zen":"Keep it logically awesome."}`)
	ghSig := remember("sha256=" + macHex(biGitHub, string(ghBody)))
	shopBody := []byte(`{"id":123}`)
	shopSig := remember(macB64([]byte(biShopify), string(shopBody), base64.StdEncoding))
	swBody := []byte(`{"type":"invoice.paid"}`)
	swSign := func(id string, ts int64, b []byte) string {
		return remember("v1," + macB64(biSWKey, id+"."+strconv.FormatInt(ts, 10)+"."+string(b), base64.StdEncoding))
	}
	slackBody := []byte(`{"event_id":"Ev1","type":"event_callback"}`)
	slackSig := func(ts int64) string {
		return remember("v0=" + macHex(biSlack, "v0:"+strconv.FormatInt(ts, 10)+":"+string(slackBody)))
	}
	genBody := []byte(`{"n":1}`)
	genSig := remember(macB64([]byte(biHMAC), string(genBody), base64.StdEncoding))
	long := strings.Repeat("x", 10000)
	signed := func(body []byte, hdr ...string) func(string) *http.Request {
		return post("/webhooks/stripe", body, append([]string{"Stripe-Signature", stripeSig(body, now)}, hdr...)...)
	}
	bearerA := "Bearer " + biTokA
	order := []byte(`{"item":"book","qty":1}`)
	sqlID := `evt_'); DROP TABLE effects; --`
	bigBody := append(append([]byte(`{"id":"evt_big","pad":"`), bytes.Repeat([]byte("a"), 1<<20)...), '"', '}')

	return []badCase{
		// --- Stripe: signatures ---
		{name: "stripe/no signature", req: post("/webhooks/stripe", good), want: 401},
		{name: "stripe/empty signature", req: post("/webhooks/stripe", good, "Stripe-Signature", ""), want: 401},
		{name: "stripe/wrong secret", req: post("/webhooks/stripe", good, "Stripe-Signature", remember(stripeSign("whsec_wrong", now, good))), want: 401},
		{name: "stripe/v1 base64 instead of hex", req: post("/webhooks/stripe", good, "Stripe-Signature",
			"t="+strconv.FormatInt(now, 10)+",v1="+remember(macB64([]byte(biStripe), strconv.FormatInt(now, 10)+"."+string(good), base64.StdEncoding))), want: 401},
		{name: "stripe/v1 truncated", req: post("/webhooks/stripe", good, "Stripe-Signature", stripeSig(good, now)[:60]), want: 401},
		{name: "stripe/only v0", req: post("/webhooks/stripe", good, "Stripe-Signature", strings.Replace(stripeSig(good, now), "v1=", "v0=", 1)), want: 401},
		{name: "stripe/replay 10 min old", req: post("/webhooks/stripe", good, "Stripe-Signature", stripeSig(good, now-600)), want: 401},
		{name: "stripe/timestamp 10 min ahead", req: post("/webhooks/stripe", good, "Stripe-Signature", stripeSig(good, now+600)), want: 401},
		// 292 years ahead: the skew in seconds × time.Second wrapped to a negative Duration.
		{name: "stripe/timestamp 292 years ahead", req: post("/webhooks/stripe", good, "Stripe-Signature", stripeSig(good, now+9223372037)), want: 401},
		{name: "stripe/timestamp 584 years ahead", req: post("/webhooks/stripe", good, "Stripe-Signature", stripeSig(good, now+18446744074)), want: 401},
		{name: "stripe/timestamp at the start of int64", req: post("/webhooks/stripe", good, "Stripe-Signature", stripeSig(good, math.MinInt64)), want: 401},
		{name: "stripe/timestamp not a number", req: post("/webhooks/stripe", good, "Stripe-Signature", "t=yesterday,v1="+strings.Repeat("ab", 32)), want: 401},
		{name: "stripe/two timestamps", req: post("/webhooks/stripe", good, "Stripe-Signature", stripeSig(good, now)+",t=1"), want: 401},
		{name: "stripe/body altered after signing", req: post("/webhooks/stripe", evt("evt_bi_other"), "Stripe-Signature", stripeSig(good, now)), want: 401},
		{name: "stripe/junk signature header first of two", req: post("/webhooks/stripe", good, "Stripe-Signature", "t=1,v1=00", "Stripe-Signature", stripeSig(good, now)), want: 401},
		// --- Stripe: bodies and ids (correctly signed) ---
		{name: "stripe/bad JSON", req: signed([]byte(`{"id":"evt_bi_1",`)), want: 400},
		{name: "stripe/JSON array", req: signed([]byte(`[{"id":"evt_bi_2"}]`)), want: 400},
		{name: "stripe/empty body", req: signed([]byte{}), want: 400},
		{name: "stripe/invalid UTF-8 in id", req: signed([]byte("{\"id\":\"evt_\xff\xfe\"}")), want: 400},
		{name: "stripe/unpaired surrogate in id", req: signed([]byte(`{"id":"evt_\udbff"}`)), want: 400},
		{name: "stripe/control character in id", req: signed([]byte(`{"id":"evt_\u0000x"}`)), want: 400},
		{name: "stripe/C1 control character in id", req: signed([]byte(`{"id":"evt_\u009b2J"}`)), want: 400},
		// encoding/json reads every lone surrogate as U+FFFD: two such ids would be one.
		{name: "stripe/lone high surrogate in id", req: signed([]byte(`{"id":"evt_x\ud800"}`)), want: 400},
		{name: "stripe/lone low surrogate in id", req: signed([]byte(`{"id":"evt_x\udfff"}`)), want: 400},
		{name: "stripe/id missing", req: signed([]byte(`{"object":"event"}`)), want: 400},
		{name: "stripe/id empty", req: signed(evt("")), want: 400},
		{name: "stripe/id is an object", req: signed([]byte(`{"id":{"a":1}}`)), want: 400},
		{name: "stripe/id of 10,000 characters", req: signed(evt(long)), want: 400},
		{name: "stripe/id of 256 characters", req: signed(evt(strings.Repeat("i", 256))), want: 400},
		{name: "stripe/SQL-looking id is data", req: signed(evt(sqlID)), want: 200, effects: 1},
		{name: "stripe/SQL-looking id again is a duplicate", req: signed(evt(sqlID)), want: 200},
		{name: "stripe/wrong content type is not trusted", req: signed(evt("evt_bi_ct"), "Content-Type", "text/plain"), want: 200, effects: 1},
		{name: "stripe/body over 1 MiB", req: signed(bigBody), want: 413},
		{name: "stripe/chunked body over 1 MiB", req: func(base string) *http.Request {
			r := signed(bigBody)(base)
			r.ContentLength = -1
			r.Body = io.NopCloser(bytes.NewReader(bigBody)) // no length: sent chunked
			return r
		}, want: 413},
		// --- routing ---
		{name: "route/GET on a source", req: with(http.MethodGet, signed(good)), want: 405},
		{name: "route/PUT on a webhook source", req: with(http.MethodPut, signed(good)), want: 405},
		{name: "route/DELETE on a source", req: with(http.MethodDelete, signed(good)), want: 405},
		{name: "route/unknown source", req: post("/webhooks/nope", good), want: 404},
		{name: "route/root", req: post("/", good), want: 404},
		{name: "route/path traversal", req: post("/webhooks/../webhooks/stripe/..%2f", good), want: 404},
		// --- headers ---
		{name: "headers/one 100 KiB header", req: signed(good, "X-Big", strings.Repeat("h", 100<<10)), want: 431},
		{name: "headers/6,000 small headers", req: func(base string) *http.Request {
			r := signed(good)(base)
			for i := range 6000 {
				r.Header.Set(fmt.Sprintf("X-H-%d", i), "v")
			}
			return r
		}, want: 431},
		// --- other schemes ---
		{name: "github/no sha256= prefix", req: post("/webhooks/github", ghBody, "X-Hub-Signature-256", strings.TrimPrefix(ghSig, "sha256="), "X-GitHub-Delivery", "d1"), want: 401},
		{name: "github/base64 instead of hex", req: post("/webhooks/github", ghBody, "X-Hub-Signature-256",
			"sha256="+remember(macB64([]byte(biGitHub), string(ghBody), base64.StdEncoding)), "X-GitHub-Delivery", "d2"), want: 401},
		{name: "github/SHA-1 header only", req: post("/webhooks/github", ghBody, "X-Hub-Signature", "sha1=0123456789abcdef0123456789abcdef01234567", "X-GitHub-Delivery", "d3"), want: 401},
		{name: "github/valid signature, no delivery id", req: post("/webhooks/github", ghBody, "X-Hub-Signature-256", ghSig), want: 400},
		{name: "github/valid signature, C1 control in delivery id", req: post("/webhooks/github", ghBody, "X-Hub-Signature-256", ghSig, "X-GitHub-Delivery", "d\u0085x"), want: 400},
		{name: "github/valid signature, 300-character delivery id", req: post("/webhooks/github", ghBody, "X-Hub-Signature-256", ghSig, "X-GitHub-Delivery", strings.Repeat("d", 300)), want: 400},
		{name: "shopify/hex instead of base64", req: post("/webhooks/shopify", shopBody, "X-Shopify-Hmac-Sha256", remember(macHex(biShopify, string(shopBody))), "X-Shopify-Event-Id", "s1"), want: 401},
		{name: "shopify/base64 without padding", req: post("/webhooks/shopify", shopBody, "X-Shopify-Hmac-Sha256", strings.TrimRight(shopSig, "="), "X-Shopify-Event-Id", "s2"), want: 401},
		{name: "sw/hex signature", req: post("/webhooks/sw", swBody, "Webhook-Id", "msg_1", "Webhook-Timestamp", strconv.FormatInt(now, 10),
			"Webhook-Signature", "v1,"+remember(macHex(string(biSWKey), "msg_1."+strconv.FormatInt(now, 10)+"."+string(swBody)))), want: 401},
		{name: "sw/replay one hour old", req: post("/webhooks/sw", swBody, "Webhook-Id", "msg_2", "Webhook-Timestamp", strconv.FormatInt(now-3600, 10),
			"Webhook-Signature", swSign("msg_2", now-3600, swBody)), want: 401},
		{name: "sw/timestamp 292 years ahead", req: post("/webhooks/sw", swBody, "Webhook-Id", "msg_far", "Webhook-Timestamp", strconv.FormatInt(now+9223372037, 10),
			"Webhook-Signature", swSign("msg_far", now+9223372037, swBody)), want: 401},
		{name: "sw/no webhook-id", req: post("/webhooks/sw", swBody, "Webhook-Timestamp", strconv.FormatInt(now, 10), "Webhook-Signature", swSign("", now, swBody)), want: 401},
		{name: "sw/signature for another id", req: post("/webhooks/sw", swBody, "Webhook-Id", "msg_3", "Webhook-Timestamp", strconv.FormatInt(now, 10),
			"Webhook-Signature", swSign("msg_4", now, swBody)), want: 401},
		{name: "slack/replay 10 min old", req: post("/webhooks/slack", slackBody, "X-Slack-Request-Timestamp", strconv.FormatInt(now-600, 10), "X-Slack-Signature", slackSig(now-600)), want: 401},
		{name: "slack/timestamp 292 years ahead", req: post("/webhooks/slack", slackBody, "X-Slack-Request-Timestamp", strconv.FormatInt(now+9223372037, 10), "X-Slack-Signature", slackSig(now+9223372037)), want: 401},
		{name: "slack/no timestamp", req: post("/webhooks/slack", slackBody, "X-Slack-Signature", slackSig(now)), want: 401},
		{name: "generic/hex where base64 is configured", req: post("/webhooks/generic", genBody, "X-Signature", remember(macHex(biHMAC, string(genBody))), "X-Id", "g1"), want: 401},
		{name: "generic/valid signature, SQL-looking 10,000-character id", req: post("/webhooks/generic", genBody, "X-Signature", genSig, "X-Id", "';--"+long), want: 400},
		// --- API source ---
		{name: "api/no Authorization", req: post("/v1/orders", order, "Idempotency-Key", "k1"), want: 401},
		{name: "api/unknown token", req: post("/v1/orders", order, "Authorization", "Bearer tok-unknown", "Idempotency-Key", "k1"), want: 401},
		{name: "api/Basic instead of Bearer", req: post("/v1/orders", order, "Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("a:"+biTokA)), "Idempotency-Key", "k1"), want: 401},
		{name: "api/token with a suffix", req: post("/v1/orders", order, "Authorization", bearerA+"x", "Idempotency-Key", "k1"), want: 401},
		{name: "api/no Idempotency-Key", req: post("/v1/orders", order, "Authorization", bearerA), want: 400},
		{name: "api/two Idempotency-Key headers", req: post("/v1/orders", order, "Authorization", bearerA, "Idempotency-Key", "k1", "Idempotency-Key", "k2"), want: 400},
		{name: "api/Idempotency-Key is an inner list", req: post("/v1/orders", order, "Authorization", bearerA, "Idempotency-Key", `("a" "b")`), want: 400},
		{name: "api/Idempotency-Key of 256 characters", req: post("/v1/orders", order, "Authorization", bearerA, "Idempotency-Key", strings.Repeat("k", 256)), want: 400},
		{name: "api/Idempotency-Key of 10,000 characters", req: post("/v1/orders", order, "Authorization", bearerA, "Idempotency-Key", long), want: 400},
		{name: "api/Idempotency-Key non-ASCII", req: post("/v1/orders", order, "Authorization", bearerA, "Idempotency-Key", "clé"), want: 400},
		{name: "api/Idempotency-Key unterminated string", req: post("/v1/orders", order, "Authorization", bearerA, "Idempotency-Key", `"abc`), want: 400},
		{name: "api/SQL-looking Idempotency-Key is data", req: post("/v1/orders", order, "Authorization", bearerA, "Idempotency-Key", `k'); DELETE FROM orders; --`), want: 201, orders: 1},
		// wait × 1 s overflowed to a negative wait: the request's deadline was already past (503).
		{name: "api/Prefer: wait=9223372037 is clamped", req: post("/v1/orders", order, "Authorization", bearerA, "Idempotency-Key", "k-wait", "Prefer", "wait=9223372037"), want: 201, orders: 1},
		{name: "api/DELETE on a key", req: with(http.MethodDelete, post("/v1/orders/k1", order, "Authorization", bearerA)), want: 405},
		// --- the wire ---
		{name: "wire/control character in a header value", raw: func() []byte {
			return []byte("POST /v1/orders HTTP/1.1\r\nHost: x\r\nAuthorization: " + bearerA + "\r\nIdempotency-Key: a\x01b\r\nContent-Length: 2\r\n\r\n{}")
		}, want: 400},
		// Go's server drops Content-Length when Transfer-Encoding is chunked (RFC 9112
		// 6.3): no smuggling; the empty, unsigned body is refused by idemd.
		{name: "wire/Content-Length and Transfer-Encoding: chunked wins", raw: func() []byte {
			return []byte("POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
		}, want: 401},
		{name: "wire/two Content-Length values", raw: func() []byte {
			return []byte("POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}")
		}, want: 400},
		{name: "wire/broken chunked encoding", raw: func() []byte {
			return []byte("POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nStripe-Signature: " + stripeSig(good, now) + "\r\n\r\nzz\r\n{}\r\n0\r\n\r\n")
		}, want: 400},
		// The answers net/http writes by itself, rewritten as problem+json (internal/problemconn).
		{name: "wire/unknown Transfer-Encoding", raw: func() []byte {
			return []byte("POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n")
		}, want: 501},
		{name: "wire/HTTP/2.0 request line", raw: func() []byte { return []byte("POST /webhooks/stripe HTTP/2.0\r\nHost: x\r\n\r\n") }, want: 505},
		{name: "wire/garbage request line", raw: func() []byte { return []byte("HELLO\r\n\r\n") }, want: 400},
		{name: "wire/NUL in the path", raw: func() []byte { return []byte("POST /webhooks/str\x00ipe HTTP/1.1\r\nHost: x\r\n\r\n") }, want: 400},
	}
}

// state is the row count of every table a request could change.
type state map[string]int

func snapshot(t *testing.T, d *db) state {
	s := state{}
	for _, tb := range []string{"processed_messages", "outbox", "dead_letters", "conflicts", "effects", "orders"} {
		s[tb] = d.count(t, tb)
	}
	return s
}

// sendRaw writes raw bytes on a new connection and reads one response.
func sendRaw(t *testing.T, addr string, raw []byte) (*http.Response, []byte) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(15 * time.Second))
	_, err = c.Write(raw)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// TestBadInputCatalogue sends every request of the catalogue to the real binary and checks
// its status, that errors are problem+json, and that no table changed (apart from the
// cases that are hostile but valid, which add exactly their one row). Afterwards, the
// daemon's trace-level logs and every response are searched for secrets, tokens and
// signatures.
func TestBadInputCatalogue(t *testing.T) {
	t.Parallel()
	d := newDB(t, badInputDDL)
	nd := badInputNode(t, d, nil)
	p := nd.startReady()
	base := "http://" + nd.httpAddr
	client := &http.Client{Timeout: 20 * time.Second}
	var responses strings.Builder
	cases := catalogue()
	names := map[string]bool{}
	for _, c := range cases {
		require.False(t, names[c.name], "case names are unique: %s", c.name)
		names[c.name] = true
		t.Run(c.name, func(t *testing.T) {
			if c.bug != "" {
				t.Skip(c.bug)
			}
			before := snapshot(t, d)
			var (
				resp *http.Response
				body []byte
			)
			if c.raw != nil {
				resp, body = sendRaw(t, nd.httpAddr, c.raw())
			} else {
				var err error
				resp, err = client.Do(c.req(base))
				require.NoError(t, err)
				body, _ = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			fmt.Fprintf(&responses, "%v\n%s\n", resp.Header, body)
			require.Equal(t, c.want, resp.StatusCode, "body: %.300s", body)
			if c.want >= 400 {
				require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
				var prob struct {
					Type      string `json:"type"`
					Title     string `json:"title"`
					Status    int    `json:"status"`
					Retryable *bool  `json:"retryable"`
				}
				require.NoError(t, json.Unmarshal(body, &prob), "%s", body)
				require.NotEmpty(t, prob.Type)
				require.NotEmpty(t, prob.Title)
				require.Equal(t, c.want, prob.Status)
				require.NotNil(t, prob.Retryable)
			}
			after := snapshot(t, d)
			want := state{}
			for k, v := range before {
				want[k] = v
			}
			want["effects"] += c.effects
			want["orders"] += c.orders
			want["processed_messages"] += c.effects + c.orders
			if c.effects > 0 && strings.HasPrefix(c.name, "stripe/") {
				want["outbox"] += c.effects // the stripe source publishes
			}
			require.Equal(t, want, after, "no state changed beyond the case's own rows")
		})
	}
	t.Run("slowloris", func(t *testing.T) { slowloris(t, nd, base, client) })
	t.Run("admin/headers over the limit", func(t *testing.T) {
		// The admin server's own answers to requests net/http refuses are problem+json too.
		resp, body := sendRaw(t, nd.adminAddr, []byte("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("h", 100<<10)+"\r\n\r\n"))
		require.Equal(t, http.StatusRequestHeaderFieldsTooLarge, resp.StatusCode, "%s", body)
		require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
		require.Contains(t, string(body), `console.md#headers-too-large"`)
	})

	// The SQL-looking id did nothing but be stored as data.
	require.Equal(t, 1, d.int(t, "SELECT count(*) FROM {s}.effects WHERE message_id = 'evt_''); DROP TABLE effects; --'"))
	require.False(t, p.Exited())
	require.Equal(t, 0, p.Stop(t, stopTimeout))
	leaks := scanSecrets(nd.allLogs()+responses.String(), biSecrets())
	require.Empty(t, leaks, "secrets, tokens or signatures in logs or responses")
	t.Logf("FIGURES bad-input: cases=%d (+1 slowloris) log_bytes_scanned=%d secrets_scanned=%d leaks=0",
		len(cases), len(nd.allLogs()), len(biSecrets()))
}

// slowloris dribbles request headers slower than the server's ReadHeaderTimeout (5 s):
// the connection is closed without an answer while other clients are served.
func slowloris(t *testing.T, nd *node, base string, client *http.Client) {
	c, err := net.Dial("tcp", nd.httpAddr)
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Write([]byte("POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\n"))
	require.NoError(t, err)
	start := time.Now()
	closed := make(chan time.Duration, 1)
	go func() {
		buf := make([]byte, 1)
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		_, _ = c.Read(buf) // returns when the server closes (or answers 408)
		closed <- time.Since(start)
	}()
	served := 0
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case took := <-closed:
			require.Less(t, took, 10*time.Second, "closed within ReadHeaderTimeout")
			require.Positive(t, served, "others were served meanwhile")
			t.Logf("slowloris connection closed after %s; %d other requests served meanwhile", took.Round(100*time.Millisecond), served)
			return
		case <-tick.C:
			_, _ = c.Write([]byte("X")) // one byte of a header line, never finished
			resp, err := client.Post(base+"/webhooks/stripe", "application/json", strings.NewReader(`{}`))
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusUnauthorized {
					served++
				}
			}
		}
	}
}

func biSecrets() []string {
	out := []string{biStripe, biGitHub, biShopify, biSW, base64.StdEncoding.EncodeToString(biSWKey), string(biSWKey),
		biSlack, biHMAC, biTokA, biTokB}
	sent.Lock()
	defer sent.Unlock()
	for _, s := range sent.sigs {
		// The whole header value and the MAC alone (after t=…, v1=, sha256=, v0=).
		out = append(out, s)
		for _, part := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == '=' || r == ' ' }) {
			if len(part) >= 40 {
				out = append(out, part)
			}
		}
	}
	return out
}

// scanSecrets returns the secrets found in text, with the line they appear on.
func scanSecrets(text string, secrets []string) []string {
	var leaks []string
	for _, s := range secrets {
		if s == "" {
			continue
		}
		if i := strings.Index(text, s); i >= 0 {
			start := max(0, i-120)
			leaks = append(leaks, fmt.Sprintf("%q found: …%s…", s, text[start:min(len(text), i+len(s)+40)]))
		}
	}
	return leaks
}

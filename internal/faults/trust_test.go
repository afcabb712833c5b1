package faults

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/kafkatest"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/internal/proctest"
	"github.com/idemd/idemd/outbox"
)

// runToExit runs idemd with args and vars and returns its exit code and stderr; it fails
// the test if the process is still running after 30 s (a serve that should have refused
// to start).
func runToExit(t *testing.T, vars map[string]string, args ...string) (int, string) {
	t.Helper()
	p := proctest.Start(t, vars, args...)
	select {
	case <-p.Done():
	case <-time.After(30 * time.Second):
		t.Fatalf("idemd %v is still running:\n%s", args, p.Stderr())
	}
	return p.ExitCode(), p.Stderr()
}

// TestShortKeysRefused: a standard-webhooks secret of "whsec_" decodes to an empty HMAC key,
// with which anyone can sign. serve refuses to start (exit 2) and check reports it, naming
// the file, the pipeline, the field and the variable, never the value; likewise any key
// under 16 bytes and a short bearer token.
func TestShortKeysRefused(t *testing.T) {
	t.Parallel()
	d := newDB(t, effectsDDL)
	file := writeFile(t, fmt.Sprintf(`sources:
  - name: sw
    verify: {scheme: standard-webhooks, secrets_env: [TK_SW]}
    effect: {sql: "INSERT INTO %[1]s.effects (message_id, applied_by) VALUES (@message_id, @source)"}
  - name: gh
    verify: {scheme: github, secrets_env: [TK_GH]}
  - name: api
    verify: {scheme: bearer, tokens_env: TK_TOKENS}
    idempotency: {}
`, d.schema))
	vars := newNode(t, d.schema, file, "receiver", nil, map[string]string{
		"TK_SW": "whsec_", "TK_GH": "short-gh-secret", "TK_TOKENS": "short-token=acme",
	}).vars
	for _, cmd := range []string{"serve", "check"} {
		code, stderr := runToExit(t, vars, cmd)
		require.Equal(t, 2, code, "%s:\n%s", cmd, stderr)
		require.Contains(t, stderr, `sources[0] "sw": verify.secrets_env[0]: environment variable TK_SW: the key is shorter than 16 bytes`, cmd)
		require.Contains(t, stderr, `sources[1] "gh": verify.secrets_env[0]: environment variable TK_GH: the key is shorter than 16 bytes`, cmd)
		require.Contains(t, stderr, `sources[2] "api": verify.tokens_env: environment variable TK_TOKENS: the token of tenant "acme": the key is shorter than 16 bytes`, cmd)
		require.NotContains(t, stderr, "short-gh-secret", cmd)
		require.NotContains(t, stderr, "short-token", cmd)
	}
}

// TestUnsignedHeaderIDIsOptIn: an hmac-sha256 source's signature covers the body only; with
// a header message id, one captured request could be sent again under fresh ids. serve
// refuses such a source (exit 2, naming the field and the opt-in) unless the file says
// allow_unsigned_message_id: true, and then serves it.
func TestUnsignedHeaderIDIsOptIn(t *testing.T) {
	t.Parallel()
	d := newDB(t, effectsDDL)
	src := fmt.Sprintf(`sources:
  - name: generic
    verify: {scheme: hmac-sha256, secrets_env: [TK_HMAC], header: X-Signature}
    message_id: {header: X-Id}
    effect: {sql: "INSERT INTO %s.effects (message_id, applied_by) VALUES (@message_id, @source)"}
`, d.schema)
	secret := map[string]string{"TK_HMAC": "generic-hmac-secret-0123"}
	refused := newNode(t, d.schema, writeFile(t, src), "receiver", nil, secret)
	code, stderr := runToExit(t, refused.vars, "serve")
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, `sources[0] "generic": message_id.header: the hmac-sha256 signature covers the body only`)
	require.Contains(t, stderr, "allow_unsigned_message_id: true")

	allowed := newNode(t, d.schema, writeFile(t, src+"    allow_unsigned_message_id: true\n"), "receiver", nil, secret)
	p := allowed.startReady()
	body := []byte(`{"n":1}`)
	resp, err := http.DefaultClient.Do(post("/webhooks/generic", body, "X-Signature", macHex(secret["TK_HMAC"], string(body)), "X-Id", "g-1")("http://" + allowed.httpAddr))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, 0, p.Stop(t, stopTimeout))
	require.Equal(t, 1, d.count(t, "effects"))
}

// TestDatabasePasswordNeverLogged: IDEMD_DATABASE_URL may carry its password in a URL's
// user info, in a ?password= parameter or in a key=value password= item. serve's logs and
// check's messages (the database reachable or not) name host, port, user and database only.
func TestDatabasePasswordNeverLogged(t *testing.T) {
	t.Parallel()
	d := newDB(t, effectsDDL)
	pc, err := pgconn.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	u, err := url.Parse(pgtest.URL())
	require.NoError(t, err)
	q := u.Query()
	q.Set("password", "query-secret-5c1d")
	u.RawQuery = q.Encode()
	withUser := *u
	withUser.User = url.UserPassword(pc.User, "userinfo-secret-9a4e")
	withUser.RawQuery = ""
	keyValue := fmt.Sprintf("host=%s port=%d user=%s dbname=%s password=kv-secret-2b7f sslmode=disable", pc.Host, pc.Port, pc.User, pc.Database)
	unreachable := fmt.Sprintf("host=127.0.0.1 port=1 user=%s dbname=%s password='kv unreachable secret' connect_timeout=2", pc.User, pc.Database)
	secrets := []string{"query-secret-5c1d", "userinfo-secret-9a4e", "kv-secret-2b7f", "kv unreachable secret"}
	label := fmt.Sprintf("host=%s port=%d user=%s dbname=%s", pc.Host, pc.Port, pc.User, pc.Database)

	file := writeFile(t, "sources:\n  - name: stripe\n    verify: {scheme: stripe, secrets_env: [FAULTS_STRIPE_SECRET]}\n")
	var logs strings.Builder
	for _, conn := range []string{u.String(), withUser.String(), keyValue} {
		nd := newNode(t, d.schema, file, "receiver", nil, map[string]string{"FAULTS_STRIPE_SECRET": faultsStripeSecret})
		nd.vars["IDEMD_DATABASE_URL"] = conn
		p := nd.startReady()
		require.Equal(t, 0, p.Stop(t, stopTimeout))
		require.Contains(t, p.Stderr(), label, "the start line names the database")
		logs.WriteString(p.Stderr())
		_, stderr := runToExit(t, nd.vars, "check")
		logs.WriteString(stderr)
	}
	nd := newNode(t, d.schema, file, "receiver", nil, map[string]string{"FAULTS_STRIPE_SECRET": faultsStripeSecret})
	nd.vars["IDEMD_DATABASE_URL"] = unreachable
	code, stderr := runToExit(t, nd.vars, "check")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "does not answer")
	logs.WriteString(stderr)
	require.Empty(t, scanSecrets(logs.String(), secrets))
}

// TestDeliveryURLNeverLogged: an outbound endpoint's URL is often a capability (Slack's
// /services/T/B/<secret>, ?token=…). With the endpoint refusing connections, the daemon's
// debug and warn logs, http_deliveries.last_error and the http_endpoints row carry the
// pipeline's name and scheme://host:port only; Go's client quotes the whole URL in its errors.
func TestDeliveryURLNeverLogged(t *testing.T) {
	t.Parallel()
	d := newDB(t, effectsDDL)
	broker := newBroker(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closedAddr := ln.Addr().String()
	require.NoError(t, ln.Close())
	const pathSecret, querySecret = "T0AB12CD/B0EF34GH/capability7e2d9a", "query-token-3b8c1f"
	file := writeFile(t, fmt.Sprintf(`sources:
  - name: stripe
    verify: {scheme: stripe, secrets_env: [FAULTS_STRIPE_SECRET]}
    publish: {http: {url: "http://%s/services/%s?token=%s", secret_env: TK_SINK, timeout: 2s}}
`, closedAddr, pathSecret, querySecret))
	nd := newNode(t, d.schema, file, "receiver,relay", broker.ListenAddrs(), map[string]string{
		"FAULTS_STRIPE_SECRET": faultsStripeSecret, "TK_SINK": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "IDEMD_LOG_LEVEL": "debug",
	})
	p := nd.startReady()
	resp, err := http.DefaultClient.Do(stripeRequest(t, "http://"+nd.httpAddr+"/webhooks/stripe", faultsStripeSecret, evt("evt_capability_1")))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	// The attempt's row is written before its log line.
	require.NoError(t, p.WaitLog("delivery failed; retrying", 1, 60*time.Second))
	require.Equal(t, 1, d.count(t, "http_deliveries WHERE last_error IS NOT NULL"))
	require.Equal(t, 0, p.Stop(t, stopTimeout))
	var stored string
	require.NoError(t, d.pool.QueryRow(context.Background(), "SELECT (SELECT string_agg(last_error, ' ') FROM "+d.schema+
		".http_deliveries) || ' ' || (SELECT string_agg(name || ' ' || url, ' ') FROM "+d.schema+".http_endpoints)").Scan(&stored))
	require.Contains(t, stored, "http://"+closedAddr)
	require.Contains(t, stored, "connection refused")
	require.Empty(t, scanSecrets(stored+nd.allLogs(), []string{pathSecret, querySecret, "capability7e2d9a", "/services/"}))
}

// TestKafkaHeaderWithCRLFIsDelivered: a Kafka record whose event-type header holds CR/LF is
// published to an HTTP endpoint (publish.http). The header is made a valid HTTP field value
// when the event is enqueued, so the POST goes out at once, with no header injected, and the
// next record of the same key follows. Before, every attempt failed before sending and was
// retried for a day, holding back the key's later events.
func TestKafkaHeaderWithCRLFIsDelivered(t *testing.T) {
	t.Parallel()
	d := newDB(t, effectsDDL)
	broker := newBroker(t)
	brokers := broker.ListenAddrs()
	in := "in-" + d.schema
	kafkatest.CreateTopicOn(t, brokers, in, 1)
	type got struct{ id, eventType, injected string }
	received := make(chan got, 10)
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		received <- got{r.Header.Get("Idempotency-Key"), r.Header.Get("Event-Type"), r.Header.Get("X-Injected")}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(sink.Close)
	file := writeFile(t, fmt.Sprintf(`subscriptions:
  - name: fwd
    topics: [%s]
    publish: {key: {key: true}, http: {url: %q, secret_env: TK_SINK, timeout: 2s}}
`, in, sink.URL+"/hook"))
	produce(t, brokers, in, []kafka.Message{
		{Key: []byte("k"), Value: []byte(`{"n":1}`), Headers: []kafka.Header{{Key: "message-id", Value: []byte("m1")}, {Key: "event-type", Value: []byte("order.paid\r\nX-Injected: 1")}}},
		{Key: []byte("k"), Value: []byte(`{"n":2}`), Headers: []kafka.Header{{Key: "message-id", Value: []byte("m2")}, {Key: "event-type", Value: []byte("order.shipped")}}},
	})
	nd := newNode(t, d.schema, file, "consumer,relay", brokers, map[string]string{"TK_SINK": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"})
	p := nd.startReady()
	var seen []got
	for len(seen) < 2 {
		select {
		case g := <-received:
			seen = append(seen, g)
		case <-time.After(30 * time.Second):
			t.Fatalf("deliveries so far: %+v", seen)
		}
	}
	require.Equal(t, 0, p.Stop(t, stopTimeout))
	require.Equal(t, []got{
		{outbox.OperationID("fwd", "m1", 0).String(), "order.paid  X-Injected: 1", ""},
		{outbox.OperationID("fwd", "m2", 0).String(), "order.shipped", ""},
	}, seen, "each delivered once, in key order, nothing injected")
	require.Equal(t, 2, d.count(t, "http_deliveries WHERE state = 'delivered' AND attempts = 1"))
}

// TestReceiverResourceCaps: IDEMD_HTTP_MAX_CONNS bounds the receiver's open connections
// (one more is closed unread), and IDEMD_HTTP_MAX_UNVERIFIED_BYTES the bodies read before
// verification: while a 1 MiB body is being read, another 1 MiB request is answered 503
// with Retry-After before its body is sent ("Expect: 100-continue" shows when the server
// asks for a body), a small one is served. Memory no longer grows with connections × 1 MiB.
func TestReceiverResourceCaps(t *testing.T) {
	t.Parallel()
	d := newDB(t, effectsDDL)
	const secret = "github-secret-caps-0123"
	file := writeFile(t, "sources:\n  - name: gh\n    verify: {scheme: github, secrets_env: [TK_GH]}\n")
	nd := newNode(t, d.schema, file, "receiver", nil, map[string]string{
		"TK_GH": secret, "IDEMD_HTTP_MAX_CONNS": "4", "IDEMD_HTTP_MAX_UNVERIFIED_BYTES": strconv.Itoa(3 << 19),
	})
	p := nd.startReady()
	type conn struct {
		c  net.Conn
		br *bufio.Reader
	}
	dial := func() conn {
		c, err := net.Dial("tcp", nd.httpAddr)
		require.NoError(t, err)
		require.NoError(t, c.SetDeadline(time.Now().Add(30*time.Second)))
		t.Cleanup(func() { c.Close() })
		return conn{c, bufio.NewReader(c)}
	}
	head := func(id string, body []byte) []byte {
		return fmt.Appendf(nil, "POST /webhooks/gh HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nExpect: 100-continue\r\n"+
			"X-Hub-Signature-256: sha256=%s\r\nX-GitHub-Delivery: %s\r\n\r\n", len(body), macHex(secret, string(body)), id)
	}
	// send writes a request's head; with the body when the server asks for it (100 Continue).
	send := func(c conn, id string, body []byte) *http.Response {
		_, err := c.c.Write(head(id, body))
		require.NoError(t, err)
		res, err := http.ReadResponse(c.br, nil)
		require.NoError(t, err)
		if res.StatusCode == http.StatusContinue {
			_, err = c.c.Write(body)
			require.NoError(t, err)
			res, err = http.ReadResponse(c.br, nil)
			require.NoError(t, err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		return res
	}
	small := func(id string) []byte { return fmt.Appendf(nil, `{"zen":%q}`, id) }
	var conns []conn
	for i := range 4 {
		c := dial()
		id := fmt.Sprintf("d-%d", i)
		require.Equal(t, 200, send(c, id, small(id)).StatusCode)
		conns = append(conns, c)
	}
	fifth := dial()
	_, _ = fifth.c.Write(head("d-5", small("d-5")))
	_, err := http.ReadResponse(fifth.br, nil)
	require.Error(t, err, "the fifth connection is closed unread")

	big := append(append([]byte(`{"pad":"`), bytes.Repeat([]byte("a"), 1<<20-10)...), '"', '}')
	held := conns[0]
	_, err = held.c.Write(head("d-big-1", big))
	require.NoError(t, err)
	res, err := http.ReadResponse(held.br, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusContinue, res.StatusCode, "the first 1 MiB body is asked for")

	refused := send(conns[1], "d-big-2", big)
	require.Equal(t, http.StatusServiceUnavailable, refused.StatusCode)
	require.Equal(t, "1", refused.Header.Get("Retry-After"))
	require.Equal(t, 200, send(conns[2], "d-small-2", small("d-small-2")).StatusCode, "a small body still fits")

	_, err = held.c.Write(big)
	require.NoError(t, err)
	res, err = http.ReadResponse(held.br, nil)
	require.NoError(t, err)
	require.Equal(t, 200, res.StatusCode)
	require.Equal(t, 0, p.Stop(t, stopTimeout))
}

package idemclient_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/idemclient"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/receiver"
)

// TestClientAgainstAnIdemdAPISource: an idemd API source behind a proxy that loses the
// first answers after the effect committed. The client retries with its one key; the
// effect runs once, and the client gets the original result (replayed).
func TestClientAgainstAnIdemdAPISource(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWithOptions(t, pgtest.Options{MaxConns: 4})
	db.Exec(t, db.Q(`CREATE TABLE {schema}.orders (
		id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, tenant text, key text, body jsonb)`))
	rcv, err := receiver.New(db.Pool, &receiver.Config{Schema: db.Schema, Sources: []receiver.Source{{
		Name:        "orders",
		Path:        "/v1/orders",
		Verify:      receiver.Verify{Scheme: receiver.SchemeBearer, Tokens: map[string]string{"token-a-0123456789": "acme"}},
		Idempotency: &receiver.Idempotency{Required: true},
		Effect: receiver.Effect{SQL: db.Q(`INSERT INTO {schema}.orders (tenant, key, body)
			VALUES (@tenant, @key, @payload) RETURNING id, tenant`), Status: 201},
	}}})
	require.NoError(t, err)
	t.Cleanup(rcv.Close)
	api := httptest.NewServer(rcv)
	t.Cleanup(api.Close)

	// The proxy forwards every request; the first two answers are lost on the way back,
	// after idemd committed.
	var forwarded atomic.Int32
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		out, err := http.NewRequestWithContext(r.Context(), r.Method, api.URL+r.URL.RequestURI(), bytes.NewReader(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		out.Header = r.Header.Clone()
		resp, err := http.DefaultClient.Do(out)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		answer, _ := io.ReadAll(resp.Body)
		if forwarded.Add(1) <= 2 {
			drop(w)
			return
		}
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(answer)
	}))
	t.Cleanup(proxy.Close)

	c, retries := newClient(t, idemclient.Config{})
	req, err := http.NewRequest(http.MethodPost, proxy.URL+"/v1/orders", strings.NewReader(`{"sku":"book","qty":1}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer token-a-0123456789")
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(context.Background(), req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)

	require.Equal(t, http.StatusCreated, resp.StatusCode, "the original status: %s", body)
	require.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"))
	require.Equal(t, int32(3), forwarded.Load())
	require.Len(t, *retries, 2)
	require.Equal(t, 1, db.Count(t, "{schema}.orders"), "one effect")

	var id int64
	key := resp.Request.Header.Get(idemclient.HeaderIdempotencyKey)
	require.NoError(t, db.Pool.QueryRow(context.Background(), db.Q(`SELECT id FROM {schema}.orders WHERE key = $1 AND tenant = 'acme'`), key).Scan(&id))
	var got any
	require.NoError(t, json.Unmarshal(body, &got))
	rows := got
	if list, ok := got.([]any); ok && len(list) == 1 {
		rows = list[0]
	}
	require.EqualValues(t, id, rows.(map[string]any)["id"], "the client returns the original result: %s", body)
}

// TestKeysAsTheReceiverReadsThem: the key the caller sets is the key idemd's parser reads,
// a comma, a quote or spaces included; a key idemd would refuse is refused before sending.
func TestKeysAsTheReceiverReadsThem(t *testing.T) {
	t.Parallel()
	got := make(chan string, 1)
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, err := receiver.ParseIdempotencyKey(r.Header.Values(idemclient.HeaderIdempotencyKey))
		if err != nil {
			key = "refused: " + err.Error()
		}
		got <- key
	}))
	t.Cleanup(api.Close)
	c, _ := newClient(t, idemclient.Config{})
	do := func(header ...string) error {
		req, err := http.NewRequest(http.MethodPost, api.URL, strings.NewReader(`{}`))
		require.NoError(t, err)
		for _, h := range header {
			req.Header.Add(idemclient.HeaderIdempotencyKey, h)
		}
		resp, err := c.Do(context.Background(), req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	for header, want := range map[string]string{
		"order-42":                              "order-42",
		"order,42":                              "order,42",
		`say "hi"`:                              `say "hi"`,
		`back\slash`:                            `back\slash`,
		" padded ":                              " padded ",
		`"already,quoted"`:                      "already,quoted",
		strings.Repeat("k", receiver.KeyMaxLen): strings.Repeat("k", receiver.KeyMaxLen),
	} {
		require.NoError(t, do(header), header)
		require.Equal(t, want, <-got, "header %q", header)
	}
	for _, header := range [][]string{{strings.Repeat("k", receiver.KeyMaxLen+1)}, {"caf\u00e9"}, {"a", "b"}, {`"unclosed`}} {
		err := do(header...)
		require.ErrorIs(t, err, idemclient.ErrInvalidKey, "%q", header)
		require.ErrorContains(t, err, "Idempotency-Key", "%q", header)
	}
	require.Empty(t, got, "nothing sent with an invalid key")
}

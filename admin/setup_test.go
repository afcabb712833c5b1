package admin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/admin"
	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/pipeline"
	"github.com/idemd/idemd/receiver"
)

const (
	testToken  = "test-admin-token-0123456789"
	aliceToken = "alice-admin-token-0123456789"
)

// bundle is one test's idemd: a schema, a receiver whose source "hooks" dead-letters every
// webhook until the gate is opened (its effect inserts the gate's value into a NOT NULL
// column), as does "versions", which has the stale-event guard on /entity and /version,
// and the admin server replaying through that receiver (and the doors a test adds to rp).
type bundle struct {
	db      *pgtest.DB
	rcv     *receiver.Receiver
	hooks   *httptest.Server
	adm     *admin.Server
	srv     *httptest.Server
	rp      *deadletter.Replayer
	sources []receiver.Source
}

type options struct {
	tokens        string
	insecureReads bool
	consumers     admin.ConsumerStatus
	keepPublished bool
}

func setup(t *testing.T, o options) *bundle {
	t.Helper()
	db := pgtest.NewWithOptions(t, pgtest.Options{MaxConns: 16})
	db.Exec(t, db.Q(`CREATE TABLE {schema}.gate (v int)`))
	db.Exec(t, db.Q(`CREATE TABLE {schema}.effects (message_id text NOT NULL, v int NOT NULL)`))
	sources := []receiver.Source{{
		Name:            "hooks",
		Verify:          receiver.Verify{Scheme: receiver.SchemeNone},
		AllowUnverified: true,
		MessageID:       &pipeline.Field{JSON: "/id"},
		Effect:          receiver.Effect{SQL: db.Q(gatedEffect)},
	}, {
		Name:            "versions",
		Verify:          receiver.Verify{Scheme: receiver.SchemeNone},
		AllowUnverified: true,
		MessageID:       &pipeline.Field{JSON: "/id"},
		Order:           &pipeline.Order{Entity: pipeline.Field{JSON: "/entity"}, Version: pipeline.Field{JSON: "/version"}},
		Effect:          receiver.Effect{SQL: db.Q(gatedEffect)},
	}, {
		Name:            "other",
		Verify:          receiver.Verify{Scheme: receiver.SchemeNone},
		AllowUnverified: true,
		MessageID:       &pipeline.Field{JSON: "/id"},
		Effect:          receiver.Effect{SQL: db.Q(gatedEffect)},
	}, {
		Name:        "orders",
		Path:        "/v1/orders",
		Verify:      receiver.Verify{Scheme: receiver.SchemeBearer, Tokens: map[string]string{"tok-acme-0123456789": "acme"}},
		Idempotency: &receiver.Idempotency{Required: true},
	}}
	quiet := logrus.New()
	quiet.SetOutput(io.Discard)
	rcv, err := receiver.New(db.Pool, &receiver.Config{Schema: db.Schema, Sources: sources, Logger: logrus.NewEntry(quiet)})
	require.NoError(t, err)
	t.Cleanup(rcv.Close)
	hooks := httptest.NewServer(rcv)
	t.Cleanup(hooks.Close)

	// Replays go through the receiver's door, registered as the daemon registers it.
	rp := deadletter.NewReplayer(db.Pool, deadletter.New(db.Schema))
	rcv.RegisterReplay(rp)
	tokens, err := admin.ParseTokens(o.tokens)
	require.NoError(t, err)
	adm, err := admin.New(db.Pool, &admin.Config{
		Schema: db.Schema, Tokens: tokens, InsecureReads: o.insecureReads,
		Replayer: rp, Consumers: o.consumers, Sources: sources, OutboxKeepsPublished: o.keepPublished, Logger: logrus.NewEntry(quiet),
	})
	require.NoError(t, err)
	adm.Started()
	srv := httptest.NewServer(adm)
	t.Cleanup(srv.Close)
	return &bundle{db: db, rcv: rcv, hooks: hooks, adm: adm, srv: srv, rp: rp, sources: sources}
}

// gatedEffect is the effect of the test's pipelines: it fails for good (a NULL in a NOT NULL
// column) until the gate is opened.
const gatedEffect = `INSERT INTO {schema}.effects (message_id, v) VALUES (@message_id, (SELECT v FROM {schema}.gate))`

// webhook posts {"id": id, …} to a source and returns the status.
func (b *bundle) webhook(t *testing.T, source, id, extra string) int {
	t.Helper()
	res, err := http.Post(b.hooks.URL+"/webhooks/"+source, "application/json",
		strings.NewReader(fmt.Sprintf(`{"id":%q%s}`, id, extra)))
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode
}

// deadLetters sends n webhooks to source concurrently; each is dead-lettered (202).
func (b *bundle) deadLetters(t *testing.T, source, prefix string, n int) {
	t.Helper()
	var wg sync.WaitGroup
	ids := make(chan int)
	errs := make(chan string, n)
	for w := 0; w < 16; w++ {
		wg.Go(func() {
			for i := range ids {
				if code := b.webhook(t, source, fmt.Sprintf("%s-%04d", prefix, i), ""); code != http.StatusAccepted {
					errs <- fmt.Sprintf("%s-%04d: %d", prefix, i, code)
				}
			}
		})
	}
	for i := 0; i < n; i++ {
		ids <- i
	}
	close(ids)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatalf("webhook not dead-lettered: %s", e)
	}
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(r.body, &m), "%s", r.body)
	return m
}

// data returns a list's items.
func (r reply) data(t *testing.T) []map[string]any {
	t.Helper()
	var p struct {
		Data []map[string]any `json:"data"`
		Next string           `json:"next"`
	}
	require.NoError(t, json.Unmarshal(r.body, &p), "%s", r.body)
	return p.Data
}

func (r reply) next(t *testing.T) string {
	t.Helper()
	var p struct {
		Next string `json:"next"`
	}
	require.NoError(t, json.Unmarshal(r.body, &p), "%s", r.body)
	return p.Next
}

// call sends a request to the admin server with token ("" for none).
func (b *bundle) call(t *testing.T, method, path, token string, body any) reply {
	t.Helper()
	var rd io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		require.NoError(t, err)
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(context.Background(), method, b.srv.URL+path, rd)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return reply{status: res.StatusCode, header: res.Header, body: raw}
}

func (b *bundle) get(t *testing.T, path string) reply { return b.call(t, "GET", path, testToken, nil) }

// problemType checks an RFC 9457 answer and returns its type's name.
func (r reply) problemType(t *testing.T) string {
	t.Helper()
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"), "%d %s", r.status, r.body)
	m := r.json(t)
	require.EqualValues(t, r.status, m["status"])
	return strings.TrimPrefix(m["type"].(string), admin.ProblemTypeBase)
}

// get serves one GET on h and returns the status.
func get(t *testing.T, h http.Handler, path string) int {
	t.Helper()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
	return w.Code
}

package delivery_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/delivery"
	"github.com/idemd/idemd/outbox"
)

// TestCapabilityURLsNeverStored: an endpoint URL whose path and query are secrets (Slack's
// /services/T/B/<secret>, ?token=…) reaches no log line (debug included), no
// http_deliveries.last_error, no dead letter and no http_endpoints row: they hold the
// endpoint's name and scheme://host:port only. Go's client quotes the whole URL in its
// errors ("Post \"…\": dial tcp …"); a refused connection and a 410 are tried.
func TestCapabilityURLsNeverStored(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closedAddr := ln.Addr().String()
	require.NoError(t, ln.Close()) // connections to it are refused
	const pathSecret, querySecret = "capability-path-7d1e9b", "capability-query-4a2f6c"
	refused := delivery.Endpoint{Name: "refused", URL: "http://" + closedAddr + "/services/T0/B0/" + pathSecret + "?token=" + querySecret,
		Secret: testSecret}
	gone := newEndpoint(t, func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(http.StatusGone) })
	goneEp := delivery.Endpoint{Name: "gone-" + b.db.Schema, URL: gone.srv.URL + "/hooks/" + pathSecret + "?token=" + querySecret,
		Secret: testSecret}

	l, hook := logtest.NewNullLogger()
	l.SetLevel(logrus.TraceLevel)
	b.enqueue(t, event("refused", "m1", "", `{}`), event(goneEp.Name, "m2", "", `{}`))
	b.start(t, delivery.Config{Endpoints: []delivery.Endpoint{refused, goneEp}, MaxAttempts: 2, Logger: logrus.NewEntry(l)})
	var seen []delivery.Attempt
	outcomes := map[delivery.Outcome]int{}
	deadline := time.After(60 * time.Second)
	for outcomes[delivery.DeadLettered] == 0 || outcomes[delivery.Disabled] == 0 {
		select {
		case a := <-b.attempts:
			seen = append(seen, a)
			outcomes[a.Outcome]++
		case <-deadline:
			t.Fatalf("no dead letter and 410 yet; attempts: %+v", seen)
		}
	}
	for _, a := range seen {
		if a.Err != nil {
			require.NotContains(t, a.Err.Error(), pathSecret, "Attempt.Err")
		}
	}

	var stored strings.Builder
	rows, err := b.db.Pool.Query(context.Background(), "SELECT coalesce(last_error, '') FROM "+b.db.Schema+".http_deliveries "+
		"UNION ALL SELECT url || ' ' || coalesce(disabled_reason, '') FROM "+b.db.Schema+".http_endpoints "+
		"UNION ALL SELECT reason || ' ' || metadata::text FROM "+b.db.Schema+".dead_letters")
	require.NoError(t, err)
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		stored.WriteString(s + "\n")
	}
	require.NoError(t, rows.Err())
	var logs strings.Builder
	for _, e := range hook.AllEntries() {
		line, err := e.String()
		require.NoError(t, err)
		logs.WriteString(line)
	}
	all := stored.String() + logs.String()
	require.Contains(t, stored.String(), "http://"+closedAddr, "the redacted URL names the host and port")
	require.Contains(t, stored.String(), "connection refused")
	require.Contains(t, logs.String(), `endpoint=refused`)
	// A delivery's lines name the message it delivers, as the consumer's and receiver's do.
	var dead *logrus.Entry
	for _, e := range hook.AllEntries() {
		if e.Message == "delivery dead-lettered" {
			dead = e
		}
	}
	require.NotNil(t, dead, "the dead letter is logged")
	require.Equal(t, "p", dead.Data["pipeline"])
	require.Equal(t, "m1", dead.Data["message_id"])
	require.NotContains(t, all, pathSecret)
	require.NotContains(t, all, querySecret)
	require.NotContains(t, all, "/services/")
}

// TestUnbuildableRequestDeadLettersAtOnce: a row whose header cannot go into an HTTP request
// (a CR/LF in event-type, as rows enqueued before outbox cleaned them could hold) is
// dead-lettered on its first attempt, with nothing sent: retried, it failed the same way for
// a day and held back its key's later events. The next event of its key is then delivered.
func TestUnbuildableRequestDeadLettersAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	e := newEndpoint(t, func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(http.StatusOK) })
	ctx := context.Background()
	_, err := b.db.Pool.Exec(ctx, "INSERT INTO "+b.db.Schema+`.http_deliveries (endpoint, operation_id, pipeline, causation_id, key, payload, headers)
VALUES ('partner', $1, 'p', 'm0', 'k', '{"bad":true}', $2)`, outbox.OperationID("p", "m0", 0),
		map[string]string{outbox.HeaderEventType: "order.paid\r\nX-Injected: 1"})
	require.NoError(t, err)
	b.enqueue(t, event("partner", "m1", "k", `{"good":true}`))
	b.start(t, delivery.Config{Endpoints: []delivery.Endpoint{endpointConfig("partner", e)}})
	seen := b.waitFor(t, delivery.Delivered, 1)

	require.Equal(t, delivery.DeadLettered, seen[0].Outcome, "the first attempt dead-letters: %+v", seen)
	require.Equal(t, 1, seen[0].Number)
	attempts, _, order := e.snapshot()
	require.Len(t, attempts, 1, "nothing was sent for the bad row")
	require.Equal(t, []string{`{"good":true}`}, order[""])
	letters, err := deadletter.New(b.db.Schema).List(ctx, b.db.Pool, deadletter.Filter{})
	require.NoError(t, err)
	require.Len(t, letters, 1)
	require.Contains(t, letters[0].Reason, "refused before sending")
	require.Contains(t, letters[0].Reason, "Event-Type")
}

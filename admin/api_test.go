package admin_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/idemd/idemd/admin"
	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/internal/pgtest"
)

// page walks a list with limit and returns every item, checking that no item repeats.
func (b *bundle) walk(t *testing.T, path string, limit int, key string) []map[string]any {
	t.Helper()
	var all []map[string]any
	seen := map[string]bool{}
	after := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 100)
		sep := "?"
		if strings.Contains(path, "?") {
			sep = "&"
		}
		r := b.get(t, fmt.Sprintf("%s%slimit=%d&after=%s", path, sep, limit, url.QueryEscape(after)))
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		items := r.data(t)
		require.LessOrEqual(t, len(items), limit)
		if pages > 0 {
			require.NotEmpty(t, items, "a next cursor leads to a page with items")
		}
		for _, it := range items {
			k := fmt.Sprint(it[key], "/", it["pipeline"], "/", it["tenant"])
			require.False(t, seen[k], "item %s repeated across pages", k)
			seen[k] = true
		}
		all = append(all, items...)
		if after = r.next(t); after == "" {
			return all
		}
	}
}

func ids(items []map[string]any, key string) []string {
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = fmt.Sprint(it[key])
	}
	return out
}

func TestMessagesFiltersAndPagination(t *testing.T) {
	t.Parallel()
	b := setup(t, options{tokens: testToken})
	// Records at known times: 5 done in hooks, 2 dead in hooks, 3 done in other; one API
	// key per tenant.
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	ins := func(scope, id, status string, at time.Time) {
		b.db.Exec(t, b.db.Q(`INSERT INTO {schema}.processed_messages (scope, message_id, fingerprint, status, received_at, completed_at, expires_at)
			VALUES ($1, $2, '\xab', $3, $4::timestamptz, $4::timestamptz, $4::timestamptz + interval '7 days')`), scope, id, status, at)
	}
	for i := 0; i < 5; i++ {
		ins("hooks", fmt.Sprintf("h-%d", i), "done", base.Add(time.Duration(i)*time.Minute))
	}
	ins("hooks", "h-dead-1", "dead", base.Add(10*time.Minute))
	ins("hooks", "h-dead-2", "dead", base.Add(11*time.Minute))
	for i := 0; i < 3; i++ {
		ins("other", fmt.Sprintf("o-%d", i), "done", base.Add(time.Duration(i)*time.Minute))
	}
	ins("orders\x1facme", "k-1", "done", base)
	ins("orders\x1fglobex", "k-1", "done", base.Add(time.Minute))

	all := b.walk(t, "/api/v1/messages", 3, "message_id")
	require.Len(t, all, 12)
	for i := 1; i < len(all); i++ {
		require.GreaterOrEqual(t, all[i-1]["received_at"], all[i]["received_at"], "newest first")
	}

	hooks := b.walk(t, "/api/v1/messages?pipeline=hooks", 2, "message_id")
	require.Equal(t, []string{"h-dead-2", "h-dead-1", "h-4", "h-3", "h-2", "h-1", "h-0"}, ids(hooks, "message_id"))
	require.Equal(t, "dead_lettered", hooks[0]["status"])
	require.Equal(t, "ab", hooks[0]["fingerprint"])

	dead := b.get(t, "/api/v1/messages?outcome=dead_lettered").data(t)
	require.Equal(t, []string{"h-dead-2", "h-dead-1"}, ids(dead, "message_id"))

	window := b.get(t, "/api/v1/messages?pipeline=hooks&since="+base.Add(time.Minute).Format(time.RFC3339)+"&until="+base.Add(3*time.Minute).Format(time.RFC3339)).data(t)
	require.Equal(t, []string{"h-2", "h-1"}, ids(window, "message_id"), "since inclusive, until exclusive")

	byID := b.get(t, "/api/v1/messages?id=k-1").data(t)
	require.Len(t, byID, 2)
	require.Len(t, b.walk(t, "/api/v1/messages?id=k-1", 1, "message_id"), 2, "an id's records paged")
	require.Len(t, b.get(t, "/api/v1/messages?id=k-1&pipeline=orders&tenant=globex").data(t), 1)
	require.Empty(t, b.get(t, "/api/v1/messages?id=k-1&pipeline=hooks").data(t))
	acme := b.get(t, "/api/v1/messages?pipeline=orders&tenant=acme").data(t)
	require.Len(t, acme, 1)
	require.Equal(t, "acme", acme[0]["tenant"])
	require.Equal(t, "orders", acme[0]["pipeline"])
	require.Len(t, b.get(t, "/api/v1/messages?tenant=globex").data(t), 1)
	require.Len(t, b.get(t, "/api/v1/messages?pipeline=orders").data(t), 2, "a pipeline's filter covers all its tenants")

	for _, bad := range []string{"?since=yesterday", "?limit=0", "?limit=1001", "?outcome=maybe", "?after=%21%21"} {
		r := b.get(t, "/api/v1/messages"+bad)
		require.Equal(t, http.StatusBadRequest, r.status, bad)
		require.Equal(t, "bad-request", r.problemType(t))
	}

	one := b.get(t, "/api/v1/messages/orders/k-1?tenant=acme")
	require.Equal(t, http.StatusOK, one.status, "%s", one.body)
	require.Equal(t, "acme", one.json(t)["tenant"])
	require.Equal(t, http.StatusNotFound, b.get(t, "/api/v1/messages/hooks/nope").status)
}

// A message's story: its record, the effect's outcome, its dead letter, and a conflict with
// the conflicting payload.
func TestMessageStoryAndConflicts(t *testing.T) {
	t.Parallel()
	b := setup(t, options{tokens: testToken})
	require.Equal(t, http.StatusAccepted, b.webhook(t, "hooks", "evt-1", `,"amount":1`))
	require.Equal(t, http.StatusUnprocessableEntity, b.webhook(t, "hooks", "evt-1", `,"amount":2`))

	st := b.get(t, "/api/v1/messages/hooks/evt-1")
	require.Equal(t, http.StatusOK, st.status, "%s", st.body)
	m := st.json(t)
	require.Equal(t, "dead_lettered", m["status"])
	require.Equal(t, "dead_lettered", m["effect"].(map[string]any)["outcome"])
	require.Contains(t, m["effect"].(map[string]any)["reason"], "null value")
	require.Len(t, m["dead_letters"], 1)
	conflicts := m["conflicts"].([]any)
	require.Len(t, conflicts, 1)
	c := conflicts[0].(map[string]any)
	require.JSONEq(t, `{"id":"evt-1","amount":2}`, c["payload"].(map[string]any)["data"].(string))
	require.NotEqual(t, c["stored_fingerprint"], c["incoming_fingerprint"])

	// A delivery of the message's event dead-lettered: its letter (whose message id is the
	// delivery's operation id) is in the story too; the effect's reason stays the message's.
	op := "00000000-0000-0000-0000-0000000000d1"
	b.db.Exec(t, b.db.Q(`INSERT INTO {schema}.http_endpoints (name, url) VALUES ('erp', 'https://erp.example')`))
	b.db.Exec(t, b.db.Q(`INSERT INTO {schema}.http_deliveries (endpoint, operation_id, pipeline, causation_id, payload, state, attempts, last_status, finished_at)
		VALUES ('erp', '`+op+`', 'hooks', 'evt-1', '{}', 'dead', 3, 400, now())`))
	require.NoError(t, pgx.BeginFunc(context.Background(), b.db.Pool, func(tx pgx.Tx) error {
		_, err := deadletter.New(b.db.Schema).WriteTx(context.Background(), tx, &deadletter.Letter{
			Pipeline: "hooks", Origin: deadletter.Origin{Door: deadletter.DoorDelivery, DeliveryID: 1, OperationID: uuid.MustParse(op)},
			Scope: "http:erp", MessageID: op, Payload: []byte(`{}`), Reason: "erp answered 400", Attempts: 3,
		})
		return err
	}))
	m = b.get(t, "/api/v1/messages/hooks/evt-1").json(t)
	letters := m["dead_letters"].([]any)
	require.Len(t, letters, 2, "the message's letter and its delivery's")
	origins := []string{letters[0].(map[string]any)["origin"].(string), letters[1].(map[string]any)["origin"].(string)}
	require.ElementsMatch(t, []string{"http", "delivery"}, origins)
	require.Contains(t, m["effect"].(map[string]any)["reason"], "null value")

	list := b.get(t, "/api/v1/conflicts?pipeline=hooks").data(t)
	require.Len(t, list, 1)
	full := b.get(t, "/api/v1/conflicts?pipeline=hooks&limit=1")
	require.Len(t, full.data(t), 1)
	require.Empty(t, full.next(t), "a full last page has no next")
	require.EqualValues(t, 1, list[0]["count"])
	require.Equal(t, false, list[0]["payload_truncated"])
	require.NotEmpty(t, list[0]["expires_at"])
	require.Empty(t, b.get(t, "/api/v1/conflicts?pipeline=other").data(t))
}

func TestDeadLetterFiltersReplayAndAudit(t *testing.T) {
	t.Parallel()
	b := setup(t, options{tokens: "alice:" + aliceToken + ",ops:" + testToken})
	b.deadLetters(t, "hooks", "h", 5)
	b.deadLetters(t, "other", "o", 3)
	b.db.Exec(t, b.db.Q(`UPDATE {schema}.dead_letters SET created_at = '2026-03-01T12:00:00Z'::timestamptz + id * interval '1 minute'`))
	b.db.Exec(t, b.db.Q(`UPDATE {schema}.dead_letters SET reason = 'the endpoint https://erp.example/services/T1/B2/secret answered 500' WHERE pipeline = 'other' AND message_id = 'o-0000'`))

	all := b.walk(t, "/api/v1/dead-letters", 3, "id")
	require.Len(t, all, 8)
	require.Len(t, b.get(t, "/api/v1/dead-letters?pipeline=hooks").data(t), 5)
	require.Len(t, b.get(t, "/api/v1/dead-letters?origin=http").data(t), 8)
	require.Empty(t, b.get(t, "/api/v1/dead-letters?origin=delivery").data(t))
	require.Len(t, b.get(t, "/api/v1/dead-letters?reason=NULL+VALUE").data(t), 7, "reason: a case-insensitive substring")
	redacted := b.get(t, "/api/v1/dead-letters?reason=answered").data(t)
	require.Len(t, redacted, 1)
	require.NotContains(t, redacted[0]["reason"], "secret", "URLs in reasons are shown as scheme, host and port")
	window := b.get(t, "/api/v1/dead-letters?since=2026-03-01T12:02:00Z&until=2026-03-01T12:04:00Z").data(t)
	require.Len(t, window, 2)
	require.Equal(t, http.StatusBadRequest, b.get(t, "/api/v1/dead-letters?origin=mars").status)

	first := int64(all[len(all)-1]["id"].(float64)) // oldest
	one := b.get(t, fmt.Sprintf("/api/v1/dead-letters/%d", first)).json(t)
	require.Equal(t, "utf-8", one["payload"].(map[string]any)["encoding"])
	require.Contains(t, one["payload"].(map[string]any)["data"], `"id"`)

	// Replay fails while the cause is not fixed; nothing commits, the letter stays.
	r := b.call(t, "POST", fmt.Sprintf("/api/v1/dead-letters/%d/replay", first), aliceToken, nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Equal(t, "failed", r.json(t)["outcome"])
	require.NotContains(t, r.json(t), "effect", "a failed replay did nothing")
	require.Len(t, b.get(t, "/api/v1/dead-letters?replayed=false").data(t), 8)

	b.db.Exec(t, b.db.Q(`INSERT INTO {schema}.gate VALUES (1)`))
	r = b.call(t, "POST", fmt.Sprintf("/api/v1/dead-letters/%d/replay", first), aliceToken, nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Equal(t, "replayed", r.json(t)["outcome"])
	require.Equal(t, "applied", r.json(t)["effect"], "the effect ran again")
	r = b.call(t, "POST", fmt.Sprintf("/api/v1/dead-letters/%d/replay", first), testToken, nil)
	require.Equal(t, http.StatusConflict, r.status, "a letter is replayed once")
	require.Equal(t, "already-replayed", r.problemType(t))
	require.Equal(t, http.StatusNotFound, b.call(t, "POST", "/api/v1/dead-letters/999999/replay", testToken, nil).status)
	require.Equal(t, 1, b.db.Count(t, "{schema}.effects"))
	require.Len(t, b.get(t, "/api/v1/dead-letters?replayed=true").data(t), 1)

	// The replayed message's record says processed now, and it leaves the dead-lettered
	// list; its story keeps the letter, replayed.
	firstID := all[len(all)-1]["message_id"].(string)
	story := b.get(t, "/api/v1/messages/hooks/"+firstID).json(t)
	require.Equal(t, "processed", story["status"])
	require.Equal(t, "applied", story["effect"].(map[string]any)["outcome"])
	require.NotEmpty(t, story["dead_letters"].([]any)[0].(map[string]any)["replayed_at"])
	for _, m := range b.get(t, "/api/v1/messages?pipeline=hooks&outcome=dead_lettered").data(t) {
		require.NotEqual(t, firstID, m["message_id"])
	}
	require.Len(t, b.get(t, "/api/v1/messages?pipeline=hooks&outcome=dead_lettered").data(t), 4)

	replays := b.get(t, fmt.Sprintf("/api/v1/dead-letters/%d", first)).json(t)["replays"].([]any)
	require.Len(t, replays, 3)
	got := []string{}
	for _, e := range replays {
		m := e.(map[string]any)
		got = append(got, m["actor"].(string)+":"+m["outcome"].(string))
	}
	require.Equal(t, []string{"alice:failed", "alice:done", "ops:skipped"}, got)

	// Bulk: the dry run counts and changes nothing; the run replays the rest of hooks.
	dry := b.call(t, "POST", "/api/v1/dead-letters/replay", testToken, map[string]any{"pipeline": "hooks", "dry_run": true}).json(t)
	require.EqualValues(t, 4, dry["matched"])
	require.EqualValues(t, 0, dry["replayed"])
	require.Equal(t, 1, b.db.Count(t, "{schema}.effects"))
	run := b.call(t, "POST", "/api/v1/dead-letters/replay", testToken, map[string]any{"pipeline": "hooks"}).json(t)
	require.EqualValues(t, 4, run["matched"])
	require.EqualValues(t, 4, run["replayed"])
	require.Equal(t, 5, b.db.Count(t, "{schema}.effects"))
	require.Equal(t, http.StatusBadRequest, b.call(t, "POST", "/api/v1/dead-letters/replay", testToken, map[string]any{"pipelin": "typo"}).status)
}

// Two bulk replays of the same 1,000 letters at once: every letter's effect runs exactly
// once, every letter is marked replayed, and the two results add up.
func TestBulkReplayConcurrentExactlyOnce(t *testing.T) {
	t.Parallel()
	const n = 1000
	b := setup(t, options{tokens: testToken})
	b.deadLetters(t, "hooks", "bulk", n)
	b.deadLetters(t, "other", "keep", 10)
	require.Equal(t, n, b.db.Count(t, "{schema}.dead_letters WHERE pipeline = 'hooks'"))
	b.db.Exec(t, b.db.Q(`INSERT INTO {schema}.gate VALUES (7)`))

	filter := map[string]any{"pipeline": "hooks", "reason": "null value"}
	var wg sync.WaitGroup
	results := make([]map[string]any, 2)
	for i := range results {
		wg.Go(func() {
			r := b.call(t, "POST", "/api/v1/dead-letters/replay", testToken, filter)
			if r.status == http.StatusOK {
				results[i] = r.json(t)
			}
		})
	}
	wg.Wait()
	var replayed, skipped, failed float64
	for _, r := range results {
		require.NotNil(t, r)
		require.LessOrEqual(t, r["matched"], float64(n))
		require.Equal(t, r["matched"], r["replayed"].(float64)+r["skipped"].(float64)+r["failed"].(float64))
		replayed += r["replayed"].(float64)
		skipped += r["skipped"].(float64)
		failed += r["failed"].(float64)
	}
	require.EqualValues(t, n, replayed, "each letter replayed by exactly one of the two")
	require.EqualValues(t, 0, failed)
	t.Logf("replayed %v, skipped %v (by the other replay)", replayed, skipped)

	require.Equal(t, n, b.db.Count(t, "{schema}.effects"))
	require.Equal(t, 0, b.db.Count(t, "(SELECT message_id FROM {schema}.effects GROUP BY message_id HAVING count(*) > 1) AS twice"))
	require.Equal(t, 0, b.db.Count(t, "{schema}.dead_letters WHERE pipeline = 'hooks' AND replayed_at IS NULL"))
	require.Equal(t, 10, b.db.Count(t, "{schema}.dead_letters WHERE pipeline = 'other' AND replayed_at IS NULL"), "outside the filter: untouched")
	require.Equal(t, n, b.db.Count(t, "{schema}.admin_audit WHERE action = $1 AND outcome = 'done'", admin.ActionReplay))
	require.Equal(t, int(skipped), b.db.Count(t, "{schema}.admin_audit WHERE action = $1 AND outcome = 'skipped'", admin.ActionReplay))
}

func TestOutboxDeliveriesAndEndpoints(t *testing.T) {
	t.Parallel()
	b := setup(t, options{tokens: testToken})
	b.db.Exec(t, b.db.Q(`INSERT INTO {schema}.outbox (operation_id, pipeline, causation_id, topic, payload, created_at, published_at) VALUES
		('00000000-0000-0000-0000-000000000001', 'hooks', 'evt-1', 'a', '{}', now() - interval '1 hour', NULL),
		('00000000-0000-0000-0000-000000000002', 'hooks', 'evt-2', 'a', '{}', now() - interval '5 minutes', NULL),
		('00000000-0000-0000-0000-000000000003', 'hooks', 'evt-3', 'b', '\xff', now(), NULL)`))
	b.db.Exec(t, b.db.Q(`INSERT INTO {schema}.outbox_published (id, operation_id, pipeline, causation_id, topic, payload, created_at, published_at) VALUES
		(1000, '00000000-0000-0000-0000-000000000004', 'hooks', 'evt-4', 'b', '{}', now(), now())`))
	backlog := b.get(t, "/api/v1/outbox/backlog").data(t)
	require.Len(t, backlog, 2)
	require.Equal(t, "a", backlog[0]["topic"], "the topic with the oldest unpublished row first")
	require.EqualValues(t, 2, backlog[0]["unpublished"])
	require.Greater(t, backlog[0]["oldest_age_seconds"], 3500.0)
	require.Len(t, b.get(t, "/api/v1/outbox?topic=b").data(t), 2)
	require.Len(t, b.get(t, "/api/v1/outbox?topic=b&unpublished=true").data(t), 1)
	row := b.get(t, "/api/v1/outbox?operation_id=00000000-0000-0000-0000-000000000003").data(t)
	require.Len(t, row, 1)
	require.Equal(t, "base64", row[0]["payload"].(map[string]any)["encoding"])
	require.Len(t, b.get(t, "/api/v1/outbox?causation_id=evt-2").data(t), 1)
	published := b.get(t, "/api/v1/outbox?causation_id=evt-4").data(t)
	require.Len(t, published, 1, "a published row kept is found by its ids too")
	require.Len(t, b.get(t, "/api/v1/outbox?operation_id=00000000-0000-0000-0000-000000000004").data(t), 1)
	require.Empty(t, b.get(t, "/api/v1/outbox?causation_id=evt-4&unpublished=true").data(t))
	kept := b.get(t, "/api/v1/outbox?unpublished=false").data(t)
	require.Len(t, kept, 1, "unpublished=false: the published rows only")
	require.Equal(t, "evt-4", kept[0]["causation_id"])
	require.NotEmpty(t, kept[0]["published_at"])
	require.Empty(t, b.get(t, "/api/v1/outbox?topic=a&unpublished=false").data(t))
	require.Len(t, b.walk(t, "/api/v1/outbox", 1, "id"), 4)
	require.Equal(t, http.StatusBadRequest, b.get(t, "/api/v1/outbox?operation_id=nope").status)

	b.db.Exec(t, b.db.Q(`INSERT INTO {schema}.http_endpoints (name, url) VALUES ('erp', 'https://erp.example:8443/services/T/B/secret')`))
	b.db.Exec(t, b.db.Q(`INSERT INTO {schema}.http_deliveries (endpoint, operation_id, pipeline, causation_id, payload, state, attempts, last_status, last_error, finished_at) VALUES
		('erp', '00000000-0000-0000-0000-00000000000a', 'hooks', 'evt-1', '{}', 'dead', 20, 500, 'Post "https://erp.example:8443/services/T/B/secret": EOF', now()),
		('erp', '00000000-0000-0000-0000-00000000000b', 'hooks', 'evt-2', '{}', 'pending', 1, NULL, NULL, NULL)`))
	eps := b.get(t, "/api/v1/endpoints").data(t)
	require.Len(t, eps, 1)
	require.Equal(t, "https://erp.example:8443/[redacted]", eps[0]["url"])
	require.EqualValues(t, 1, eps[0]["pending"])
	require.EqualValues(t, 1, eps[0]["dead"])
	dead := b.get(t, "/api/v1/deliveries?endpoint=erp&state=dead").data(t)
	require.Len(t, dead, 1)
	require.NotContains(t, dead[0]["last_error"], "secret")

	require.Equal(t, http.StatusOK, b.call(t, "POST", "/api/v1/endpoints/erp/disable", testToken, nil).status)
	require.Equal(t, true, b.get(t, "/api/v1/endpoints").data(t)[0]["disabled"])
	require.Equal(t, http.StatusOK, b.call(t, "POST", "/api/v1/endpoints/erp/enable", testToken, nil).status)
	require.Equal(t, false, b.get(t, "/api/v1/endpoints").data(t)[0]["disabled"])
	require.Equal(t, http.StatusNotFound, b.call(t, "POST", "/api/v1/endpoints/nope/disable", testToken, nil).status)

	deadID := int64(dead[0]["id"].(float64))
	require.Equal(t, http.StatusOK, b.call(t, "POST", fmt.Sprintf("/api/v1/deliveries/%d/requeue", deadID), testToken, nil).status)
	require.Len(t, b.get(t, "/api/v1/deliveries?state=pending").data(t), 2)
	r := b.call(t, "POST", fmt.Sprintf("/api/v1/deliveries/%d/requeue", deadID), testToken, nil)
	require.Equal(t, http.StatusConflict, r.status, "a pending delivery is not requeued (it could be sent twice)")
	require.Equal(t, 5, b.db.Count(t, "{schema}.admin_audit"), "every write is audited, failed ones too")
	require.Equal(t, 2, b.db.Count(t, "{schema}.admin_audit WHERE outcome = 'failed'"))
}

// /readyz reuses its database checks for ReadyCache, and answers draining at once.
func TestReadyzCachedAndDraining(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	require.Equal(t, http.StatusOK, b.call(t, "GET", "/readyz", "", nil).status)
	// The migrations "disappear": the cached answer stands for the cache's second…
	b.db.Exec(t, b.db.Q(`UPDATE {schema}.schema_version SET version = 1`))
	adm, err := admin.New(b.db.Pool, &admin.Config{Schema: b.db.Schema, ReadyCache: time.Hour})
	require.NoError(t, err)
	adm.Started()
	b.db.Exec(t, b.db.Q(`UPDATE {schema}.schema_version SET version = 1000`)) // at or past every migration
	require.Equal(t, http.StatusOK, get(t, adm, "/readyz"))
	b.db.Exec(t, b.db.Q(`UPDATE {schema}.schema_version SET version = 1`))
	require.Equal(t, http.StatusOK, get(t, adm, "/readyz"), "cached: the database is asked at most once per ReadyCache")
	adm.Draining()
	require.Equal(t, http.StatusServiceUnavailable, get(t, adm, "/readyz"), "draining is not cached")

	fresh, err := admin.New(b.db.Pool, &admin.Config{Schema: b.db.Schema})
	require.NoError(t, err)
	fresh.Started()
	require.Equal(t, http.StatusServiceUnavailable, get(t, fresh, "/readyz"), "migrations not applied")
}

// /readyz tells a pool whose every connection is taken (waiting behind a migration's lock,
// say) from a database that does not answer.
func TestReadyzSaysWhenNoConnectionIsFree(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	pool := pgtest.Pool(t, 1)
	adm, err := admin.New(pool, &admin.Config{Schema: b.db.Schema})
	require.NoError(t, err)
	adm.Started()
	held, err := pool.Acquire(t.Context())
	require.NoError(t, err)
	defer held.Release()
	w := httptest.NewRecorder()
	adm.ServeHTTP(w, httptest.NewRequest("GET", "/readyz", nil))
	require.Equal(t, http.StatusServiceUnavailable, w.Code)
	require.JSONEq(t, `{"status":"not_ready","reason":"no database connection free within 2 s: all 1 in use"}`, w.Body.String())
}

func TestHTTPServerLimits(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	s := b.adm.HTTPServer()
	require.Positive(t, s.ReadHeaderTimeout)
	require.Positive(t, s.ReadTimeout)
	require.Positive(t, s.WriteTimeout)
	require.Positive(t, s.IdleTimeout)
	require.Positive(t, s.MaxHeaderBytes)
}

// Every path of the admin API refuses a query parameter it does not take, naming it (a typo
// must not return everything), and takes every parameter the document gives it. The lists
// bounded by the configuration are not paged: limit and after are refused there.
func TestUnknownQueryParametersRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, options{tokens: testToken})
	var doc struct {
		Paths map[string]map[string]struct {
			Parameters []struct {
				Ref  string `yaml:"$ref"`
				Name string `yaml:"name"`
				In   string `yaml:"in"`
			} `yaml:"parameters"`
		} `yaml:"paths"`
		Components struct {
			Parameters map[string]struct {
				Name string `yaml:"name"`
				In   string `yaml:"in"`
			} `yaml:"parameters"`
		} `yaml:"components"`
	}
	require.NoError(t, yaml.Unmarshal(admin.AdminDocument(), &doc))
	fill := strings.NewReplacer("{pipeline}", "hooks", "{id}", "1", "{name}", "erp")
	checked := 0
	for path, ops := range doc.Paths {
		if !strings.HasPrefix(path, "/api/v1/") {
			continue
		}
		for method, op := range ops {
			url := fill.Replace(path)
			r := b.call(t, strings.ToUpper(method), url+"?pipline=hooks", testToken, nil)
			require.Equal(t, http.StatusBadRequest, r.status, "%s %s: %s", method, path, r.body)
			require.Contains(t, r.json(t)["detail"], "parameter pipline: unknown", "%s %s", method, path)
			checked++
			if method != "get" {
				continue
			}
			for _, p := range op.Parameters {
				if p.Ref != "" {
					c := doc.Components.Parameters[strings.TrimPrefix(p.Ref, "#/components/parameters/")]
					p.Name, p.In = c.Name, c.In
				}
				if p.In != "query" {
					continue
				}
				r := b.call(t, "GET", url+"?"+p.Name+"=", testToken, nil)
				require.NotContains(t, string(r.body), "unknown", "%s %s takes %s", method, path, p.Name)
			}
		}
	}
	require.GreaterOrEqual(t, checked, 15)
	for _, path := range []string{"/api/v1/endpoints?limit=2", "/api/v1/consumers?after=x", "/api/v1/outbox/backlog?limit=1"} {
		r := b.get(t, path)
		require.Equal(t, http.StatusBadRequest, r.status, path)
		require.Contains(t, r.json(t)["detail"], "not paged", path)
	}
	r := b.get(t, "/api/v1/messages?pipline=hooks")
	require.Contains(t, r.json(t)["detail"], "this path takes after, body_claims, id, limit, outcome, pipeline, since, tenant, until")
}

// A GitHub-like source's claim of its signed body is not a message: the list leaves it out
// unless body_claims=true, and marks it then. A story asked for without a tenant names the
// other tenants holding the id.
func TestBodyClaimsAndOtherTenants(t *testing.T) {
	t.Parallel()
	b := setup(t, options{tokens: testToken})
	ins := func(scope, id, fp string) {
		b.db.Exec(t, b.db.Q(`INSERT INTO {schema}.processed_messages (scope, message_id, fingerprint, status, received_at, completed_at, expires_at)
			VALUES ($1, $2, decode($3, 'hex'), 'done', now(), now(), now() + interval '7 days')`), scope, id, fp)
	}
	sum := strings.Repeat("ab", 32)
	ins("gh", "delivery-1", "01")
	ins("gh\x1fbody", "sha256:"+sum, sum)
	ins("orders\x1fbody", "k-1", "02") // a tenant named body, with a key: a message
	ins("orders\x1facme", "k-1", "03")
	ins("orders\x1fglobex", "k-1", "04")

	list := b.get(t, "/api/v1/messages").data(t)
	require.ElementsMatch(t, []string{"delivery-1", "k-1", "k-1", "k-1"}, ids(list, "message_id"), "the body claim is left out")
	all := b.get(t, "/api/v1/messages?pipeline=gh&body_claims=true").data(t)
	require.Len(t, all, 2)
	for _, m := range all {
		if m["message_id"] == "sha256:"+sum {
			require.Equal(t, true, m["body_claim"])
			require.Nil(t, m["tenant"], "body is not a tenant")
		} else {
			require.Nil(t, m["body_claim"])
		}
	}

	st := b.get(t, "/api/v1/messages/orders/k-1").json(t)
	require.ElementsMatch(t, []any{"acme", "globex", "body"}, append(st["other_tenants"].([]any), st["tenant"]))
	require.Len(t, st["other_tenants"], 2, "the newest record's story, the two others named")
	one := b.get(t, "/api/v1/messages/orders/k-1?tenant=acme").json(t)
	require.Equal(t, "acme", one["tenant"])
	require.Nil(t, one["other_tenants"])
	require.Nil(t, b.get(t, "/api/v1/messages/gh/delivery-1").json(t)["other_tenants"])
	claim := b.get(t, "/api/v1/messages/gh/sha256:"+sum).json(t)
	require.Equal(t, true, claim["body_claim"])

	page := b.call(t, "GET", "/ui/messages/orders/k-1", testToken, nil)
	require.Equal(t, http.StatusOK, page.status)
	require.Contains(t, string(page.body), "This id is also held by")
	page = b.call(t, "GET", "/ui/messages?pipeline=gh&body_claims=true", testToken, nil)
	require.Contains(t, string(page.body), "body claim")
}

// A bulk replay with an empty filter needs "all": true, as `idemd dlq replay` needs -all; a
// dry run does not. The body takes id as the list names it (message_id too), and a bad time
// is reported as the list reports it.
func TestBulkReplayNeedsAllOrFilter(t *testing.T) {
	t.Parallel()
	b := setup(t, options{tokens: testToken})
	b.deadLetters(t, "hooks", "h", 3)
	b.db.Exec(t, b.db.Q(`INSERT INTO {schema}.gate VALUES (1)`))
	bulk := func(body map[string]any) reply {
		return b.call(t, "POST", "/api/v1/dead-letters/replay", testToken, body)
	}

	for _, body := range []map[string]any{{}, {"dry_run": false}, {"all": false}} {
		r := bulk(body)
		require.Equal(t, http.StatusBadRequest, r.status, "%v", body)
		require.Equal(t, "bad-request", r.problemType(t))
		require.Contains(t, r.json(t)["detail"], `send "all": true`)
	}
	require.Equal(t, 0, b.db.Count(t, "{schema}.effects"), "nothing replayed")
	require.EqualValues(t, 3, bulk(map[string]any{"dry_run": true}).json(t)["matched"], "a dry run needs no filter")

	r := bulk(map[string]any{"since": "yesterday", "dry_run": true})
	require.Equal(t, http.StatusBadRequest, r.status)
	require.Equal(t, `field since: "yesterday" is not an RFC 3339 time (like 2026-01-02T15:04:05Z)`, r.json(t)["detail"])
	r = bulk(map[string]any{"origin": "mars", "dry_run": true})
	require.Equal(t, http.StatusBadRequest, r.status)
	require.Contains(t, r.json(t)["detail"], `field origin: "mars" is not one of http`)

	require.EqualValues(t, 1, bulk(map[string]any{"id": "h-0001", "dry_run": true}).json(t)["matched"], "id, as the list names it")
	require.EqualValues(t, 1, bulk(map[string]any{"message_id": "h-0001", "dry_run": true}).json(t)["matched"])
	require.Equal(t, http.StatusBadRequest, bulk(map[string]any{"id": "h-0001", "message_id": "h-0002"}).status)

	// The console's form: without a filter, only with its "every letter" box.
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	form := func(values url.Values) string {
		req, err := http.NewRequest("POST", b.srv.URL+"/ui/dead-letters/replay", strings.NewReader(values.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Authorization", "Bearer "+testToken)
		res, err := noRedirect.Do(req)
		require.NoError(t, err)
		res.Body.Close()
		require.Equal(t, http.StatusSeeOther, res.StatusCode)
		for _, c := range res.Cookies() {
			if c.Name == "idemd_admin_flash" {
				msg, err := url.QueryUnescape(c.Value)
				require.NoError(t, err)
				return msg
			}
		}
		return ""
	}
	require.Contains(t, form(url.Values{"dry_run": {"false"}}), "Nothing replayed: the filter is empty")
	require.Equal(t, 0, b.db.Count(t, "{schema}.effects"))
	page := string(b.call(t, "GET", "/ui/dead-letters", testToken, nil).body)
	require.Contains(t, page, `name="all"`, "the box is offered when the page has no filter")
	require.NotContains(t, string(b.call(t, "GET", "/ui/dead-letters?pipeline=hooks", testToken, nil).body), `name="all"`)
	require.Contains(t, form(url.Values{"dry_run": {"false"}, "all": {"true"}}), "Bulk replay: 3 matched, 3 replayed")

	require.Equal(t, 3, b.db.Count(t, "{schema}.effects"))
	r = bulk(map[string]any{"all": true})
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.EqualValues(t, 0, r.json(t)["matched"], "all replayed already")
}

package admin_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every console page renders whole, with data in its tables, and shows ids, states and
// reasons as text; sender-controlled text is escaped.
func TestConsolePagesRender(t *testing.T) {
	t.Parallel()
	b := setup(t, options{tokens: testToken})
	require.Equal(t, http.StatusAccepted, b.webhook(t, "hooks", "evt-<b>1</b>", `,"amount":1`))
	require.Equal(t, http.StatusUnprocessableEntity, b.webhook(t, "hooks", "evt-<b>1</b>", `,"amount":2`))
	b.db.Exec(t, b.db.Q(`INSERT INTO {schema}.outbox (operation_id, pipeline, causation_id, topic, payload) VALUES (gen_random_uuid(), 'hooks', 'evt-1', 'topic-a', '{}')`))
	b.db.Exec(t, b.db.Q(`INSERT INTO {schema}.http_endpoints (name, url) VALUES ('erp', 'https://erp.example/x')`))
	b.db.Exec(t, b.db.Q(`INSERT INTO {schema}.http_deliveries (endpoint, operation_id, pipeline, causation_id, payload, state, last_error)
		VALUES ('erp', gen_random_uuid(), 'hooks', 'evt-1', '{}', 'dead', 'boom')`))
	pages := map[string][]string{
		"/ui/messages": {"evt-&lt;b&gt;1&lt;/b&gt;", "dead_lettered"},
		"/ui/messages/hooks/evt-%3Cb%3E1%3C%2Fb%3E": {"dead_lettered", "null value in column"},
		"/ui/dead-letters?pipeline=hooks":           {"not replayed", "null value in column", "Dry run"},
		"/ui/dead-letters/1":                        {"Payload (utf-8)", "Never replayed"},
		"/ui/conflicts":                             {"evt-&lt;b&gt;1&lt;/b&gt;", `&#34;amount&#34;:2`},
		"/ui/outbox":                                {"topic-a", "unpublished", "the relay deletes a row once the broker has it"},
		"/ui/deliveries":                            {"erp", "dead", "boom", "Disable erp", "Requeue"},
		"/ui/consumers":                             {"No subscription"},
	}
	for path, wants := range pages {
		r := b.get(t, path)
		require.Equal(t, http.StatusOK, r.status, "%s: %s", path, r.body)
		body := string(r.body)
		require.True(t, strings.HasSuffix(strings.TrimSpace(body), "</html>"), "%s renders whole", path)
		require.NotContains(t, body, "<b>1</b>", "%s escapes sender text", path)
		for _, w := range wants {
			require.Contains(t, body, w, path)
		}
		require.Contains(t, r.header.Get("Content-Security-Policy"), "default-src 'self'")
	}
	require.Equal(t, http.StatusNotFound, b.get(t, "/ui/dead-letters/999").status)
	for _, asset := range []string{"/ui/static/console.css", "/ui/static/console.js"} {
		require.Equal(t, http.StatusOK, b.call(t, "GET", asset, "", nil).status, "assets are embedded and open")
	}
}

// The console says whether the outbox keeps published rows: by default the relay deletes
// them, and the outbox page and a message's story say that only waiting rows are listed.
func TestConsoleSaysWhetherPublishedRowsAreKept(t *testing.T) {
	t.Parallel()
	for _, keep := range []bool{false, true} {
		b := setup(t, options{tokens: testToken, keepPublished: keep})
		require.Equal(t, http.StatusAccepted, b.webhook(t, "hooks", "evt-1", ""))
		outbox := string(b.get(t, "/ui/outbox?topic=none").body)
		story := b.get(t, "/api/v1/messages/hooks/evt-1")
		require.Equal(t, http.StatusOK, story.status)
		var st struct {
			Kept *bool `json:"outbox_published_kept"`
		}
		require.NoError(t, json.Unmarshal(story.body, &st))
		require.NotNil(t, st.Kept)
		require.Equal(t, keep, *st.Kept)
		page := string(b.get(t, "/ui/messages/hooks/evt-1").body)
		if keep {
			require.Contains(t, outbox, "published rows are kept for IDEMD_OUTBOX_RETENTION")
			require.NotContains(t, outbox, "deletes a row")
			require.NotContains(t, page, "Only rows still to publish")
			continue
		}
		require.Contains(t, outbox, "published rows are not kept")
		require.Contains(t, outbox, "the relay deletes a row once the broker has it")
		require.Contains(t, page, "Only rows still to publish are listed")
	}
}

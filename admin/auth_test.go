package admin_test

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/admin"
)

func TestParseTokens(t *testing.T) {
	t.Parallel()
	tokens, err := admin.ParseTokens(testToken)
	require.NoError(t, err)
	require.Len(t, tokens, 1)
	require.Equal(t, "admin", tokens[0].Name)

	tokens, err = admin.ParseTokens("alice:" + aliceToken + ", ops-bot:" + testToken)
	require.NoError(t, err)
	require.Equal(t, "alice", tokens[0].Name)
	require.Equal(t, "ops-bot", tokens[1].Name)

	_, err = admin.ParseTokens("alice:" + testToken + ",bob:" + testToken)
	require.ErrorContains(t, err, `"bob" has the same token as "alice"`, "one token under two names: whose write was it?")

	for _, bad := range []string{"short", "alice:short", ":" + testToken, "a b:" + testToken, "x:" + testToken + ",x:" + aliceToken, "x:" + testToken + ",y:" + testToken} {
		_, err := admin.ParseTokens(bad)
		require.Error(t, err, bad)
		require.NotContains(t, err.Error(), testToken, "errors never quote a token")
	}
}

// The authorization rules of SPEC 2.7b: probes open; everything else needs the token; a
// wrong token is refused like none; without IDEMD_ADMIN_TOKEN everything is closed; the
// read-only opt-out opens reads and still refuses writes.
func TestAuthorization(t *testing.T) {
	t.Parallel()
	writes := []string{"/api/v1/dead-letters/1/replay", "/api/v1/dead-letters/replay", "/api/v1/endpoints/x/disable", "/api/v1/deliveries/1/requeue"}
	reads := []string{"/api/v1/messages", "/api/v1/dead-letters", "/api/v1/conflicts", "/api/v1/outbox/backlog", "/api/v1/consumers", "/openapi/admin.yaml", "/debug/pprof/"}

	t.Run("token", func(t *testing.T) {
		t.Parallel()
		b := setup(t, options{tokens: testToken})
		for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
			require.Equal(t, http.StatusOK, b.call(t, "GET", p, "", nil).status, p)
		}
		for _, p := range reads {
			r := b.call(t, "GET", p, "", nil)
			require.Equal(t, http.StatusUnauthorized, r.status, "no token: %s", p)
			require.Equal(t, "unauthorized", r.problemType(t))
			require.Contains(t, r.header.Get("WWW-Authenticate"), "Bearer")
			require.Equal(t, http.StatusUnauthorized, b.call(t, "GET", p, "wrong-token-0123456789", nil).status, "wrong token: %s", p)
			require.Equal(t, http.StatusUnauthorized, b.call(t, "GET", p, testToken+"x", nil).status, "longer token: %s", p)
			require.Equal(t, http.StatusOK, b.call(t, "GET", p, testToken, nil).status, "token: %s", p)
		}
		for _, p := range writes {
			require.Equal(t, http.StatusUnauthorized, b.call(t, "POST", p, "", map[string]any{}).status, p)
			require.Equal(t, http.StatusUnauthorized, b.call(t, "POST", p, "wrong-token-0123456789", map[string]any{}).status, p)
		}
	})

	t.Run("no token configured", func(t *testing.T) {
		t.Parallel()
		b := setup(t, options{})
		r := b.call(t, "GET", "/api/v1/messages", "", nil)
		require.Equal(t, http.StatusUnauthorized, r.status)
		require.Contains(t, r.json(t)["detail"], "IDEMD_ADMIN_TOKEN is not set")
		require.Equal(t, http.StatusUnauthorized, b.call(t, "GET", "/api/v1/messages", testToken, nil).status)
		require.Equal(t, http.StatusOK, b.call(t, "GET", "/healthz", "", nil).status)
	})

	t.Run("insecure reads", func(t *testing.T) {
		t.Parallel()
		b := setup(t, options{insecureReads: true})
		for _, p := range reads {
			if strings.HasPrefix(p, "/debug/pprof/") {
				continue
			}
			require.Equal(t, http.StatusOK, b.call(t, "GET", p, "", nil).status, p)
		}
		for _, p := range writes {
			r := b.call(t, "POST", p, "", map[string]any{"dry_run": true})
			require.Equal(t, http.StatusUnauthorized, r.status, "a write stays refused: %s", p)
			require.Contains(t, r.json(t)["detail"], "IDEMD_ADMIN_INSECURE_READS opens the reads only; writes (and pprof) need the token", p)
		}
		// pprof is not a read of records: it stays behind the token.
		for _, p := range []string{"/debug/pprof/", "/debug/pprof/cmdline", "/debug/pprof/symbol", "/debug/pprof/profile?seconds=1", "/debug/pprof/trace?seconds=1"} {
			r := b.call(t, "GET", p, "", nil)
			require.Equal(t, http.StatusUnauthorized, r.status, "pprof stays closed: %s", p)
			require.Equal(t, "unauthorized", r.problemType(t), p)
		}
		// A wrong token is not an anonymous reader.
		require.Equal(t, http.StatusUnauthorized, b.call(t, "GET", "/api/v1/messages", "wrong-token-0123456789", nil).status)
	})

	t.Run("insecure reads with a token", func(t *testing.T) {
		t.Parallel()
		b := setup(t, options{tokens: testToken, insecureReads: true})
		r := b.call(t, "POST", writes[0], "", nil)
		require.Equal(t, http.StatusUnauthorized, r.status)
		require.Contains(t, r.json(t)["detail"], "writes (and pprof) need Authorization: Bearer <IDEMD_ADMIN_TOKEN>")
	})
}

// Without IDEMD_ADMIN_TOKEN a sign-in is refused as the console being closed, not logged
// as an invalid token (there is none to be wrong).
func TestSignInWithoutTokenConfigured(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	logger, hook := logtest.NewNullLogger()
	adm, err := admin.New(b.db.Pool, &admin.Config{Schema: b.db.Schema, Logger: logrus.NewEntry(logger)})
	require.NoError(t, err)
	w := httptest.NewRecorder()
	req := httptest.NewRequest("POST", "/ui/login", strings.NewReader("token="+testToken))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	adm.ServeHTTP(w, req)
	require.Equal(t, http.StatusUnauthorized, w.Code)
	require.Contains(t, w.Body.String(), "the console is closed")
	require.Len(t, hook.AllEntries(), 1)
	require.Equal(t, "console sign-in refused: IDEMD_ADMIN_TOKEN is not set, the console is closed", hook.LastEntry().Message)
}

// A console page without credentials: a browser (Accept: text/html) gets the sign-in form,
// anything else the 401 problem+json that SPEC 2.7b gives every refused request.
func TestConsoleUnauthorizedByAccept(t *testing.T) {
	t.Parallel()
	b := setup(t, options{tokens: testToken})
	for _, p := range []string{"/", "/ui/messages", "/ui/dead-letters?pipeline=x"} {
		r := b.call(t, "GET", p, "", nil)
		require.Equal(t, http.StatusUnauthorized, r.status, p)
		require.Equal(t, "application/problem+json", r.header.Get("Content-Type"), p)
		require.Equal(t, "unauthorized", r.problemType(t), p)
		require.Contains(t, r.header.Get("WWW-Authenticate"), "Bearer", p)

		for _, accept := range []string{"text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", "TEXT/HTML"} {
			req, err := http.NewRequest("GET", b.srv.URL+p, nil)
			require.NoError(t, err)
			req.Header.Set("Accept", accept)
			res, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			body, err := io.ReadAll(res.Body)
			res.Body.Close()
			require.NoError(t, err)
			require.Equal(t, http.StatusUnauthorized, res.StatusCode, p)
			require.Contains(t, res.Header.Get("Content-Type"), "text/html", p)
			require.Contains(t, string(body), `name="token"`, "the sign-in form: %s", p)
		}
	}
}

// TestUnroutedAnswersAreProblems: an unknown path answers 404 and a known path with another
// method 405 with Allow, as application/problem+json like every other error of the API, not
// the mux's plain text.
func TestUnroutedAnswersAreProblems(t *testing.T) {
	t.Parallel()
	b := setup(t, options{tokens: testToken})
	for _, c := range []struct {
		method, path, allow string
		status              int
		problem             string
	}{
		{"GET", "/api/v1/nope", "", http.StatusNotFound, "not-found"},
		{"GET", "/nope", "", http.StatusNotFound, "not-found"},
		{"POST", "/api/v1/messages", "GET, HEAD", http.StatusMethodNotAllowed, "method-not-allowed"},
		{"GET", "/api/v1/endpoints/x/disable", "POST", http.StatusMethodNotAllowed, "method-not-allowed"},
		{"DELETE", "/healthz", "GET, HEAD", http.StatusMethodNotAllowed, "method-not-allowed"},
	} {
		r := b.call(t, c.method, c.path, testToken, nil)
		require.Equal(t, c.status, r.status, "%s %s", c.method, c.path)
		require.Equal(t, "application/problem+json", r.header.Get("Content-Type"), "%s %s", c.method, c.path)
		require.Equal(t, c.problem, r.problemType(t), "%s %s", c.method, c.path)
		require.Equal(t, c.allow, r.header.Get("Allow"), "%s %s", c.method, c.path)
	}
	require.Equal(t, http.StatusOK, b.call(t, "GET", "/api/v1/messages", testToken, nil).status, "routed requests as before")

	// Without the token, routes cannot be probed: an unknown path or a wrong method is
	// refused like a known one, but on the open paths.
	for _, c := range []struct{ method, path string }{
		{"GET", "/api/v1/nope"}, {"GET", "/api/v2/x"}, {"GET", "/ui/nope"}, {"DELETE", "/api/v1/messages"}, {"GET", "/api/v1/endpoints/x/disable"},
	} {
		r := b.call(t, c.method, c.path, "", nil)
		require.Equal(t, http.StatusUnauthorized, r.status, "%s %s", c.method, c.path)
		require.Equal(t, "unauthorized", r.problemType(t))
		require.Empty(t, r.header.Get("Allow"))
	}
	require.Equal(t, http.StatusMethodNotAllowed, b.call(t, "DELETE", "/healthz", "", nil).status, "an open path's methods are no secret")
	require.Equal(t, http.StatusMethodNotAllowed, b.call(t, "DELETE", "/ui/login", "", nil).status)
	require.Equal(t, http.StatusNotFound, b.call(t, "GET", "/ui/static/nope.css", "", nil).status, "the sign-in form's assets are open")
}

// The console's sign-in sets an HttpOnly, SameSite=Strict session cookie; writes made with
// it need the page's CSRF token; the audit names the token.
func TestSessionCookieAndCSRF(t *testing.T) {
	t.Parallel()
	b := setup(t, options{tokens: "alice:" + aliceToken})
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	client := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

	res, err := client.Get(b.srv.URL + "/ui/messages")
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusUnauthorized, res.StatusCode, "the console asks for the token")

	res, err = client.PostForm(b.srv.URL+"/ui/login", url.Values{"token": {"wrong-token-0123456789"}})
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusUnauthorized, res.StatusCode)

	res, err = client.PostForm(b.srv.URL+"/ui/login", url.Values{"token": {aliceToken}, "next": {"/ui/dead-letters"}})
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.Equal(t, "/ui/dead-letters", res.Header.Get("Location"))
	cookies := res.Cookies()
	require.Len(t, cookies, 1)
	c := cookies[0]
	require.True(t, c.HttpOnly)
	require.Equal(t, http.SameSiteStrictMode, c.SameSite)
	require.NotContains(t, c.Value, aliceToken, "the cookie is a signed session, not the token")
	require.WithinDuration(t, time.Now().Add(12*time.Hour), c.Expires, time.Minute)

	res, err = client.Get(b.srv.URL + "/api/v1/endpoints")
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode, "the cookie authenticates reads")

	b.db.Exec(t, b.db.Q(`INSERT INTO {schema}.http_endpoints (name, url) VALUES ('erp', 'https://erp.example/hooks/secret-path?token=s3cr3t')`))
	post := func(csrf string) int {
		req, err := http.NewRequest("POST", b.srv.URL+"/api/v1/endpoints/erp/disable", nil)
		require.NoError(t, err)
		if csrf != "" {
			req.Header.Set("X-CSRF-Token", csrf)
		}
		res, err := client.Do(req)
		require.NoError(t, err)
		res.Body.Close()
		return res.StatusCode
	}
	require.Equal(t, http.StatusForbidden, post(""), "a cookie write without the CSRF token")
	require.Equal(t, http.StatusForbidden, post("forged"), "a cookie write with a wrong CSRF token")

	// The page carries the session's CSRF token.
	res, err = client.Get(b.srv.URL + "/ui/deliveries")
	require.NoError(t, err)
	page := readAll(t, res)
	const marker = `name="csrf" value="`
	i := strings.Index(page, marker)
	require.Positive(t, i, page)
	csrf := page[i+len(marker):]
	csrf = csrf[:strings.IndexByte(csrf, '"')]
	require.Equal(t, http.StatusOK, post(csrf))
	require.NotContains(t, page, "secret-path", "endpoint URLs are shown as scheme, host and port")
	require.NotContains(t, page, "s3cr3t")

	var actor, action, outcome string
	require.NoError(t, b.db.Pool.QueryRow(t.Context(), b.db.Q(`SELECT actor, action, outcome FROM {schema}.admin_audit`)).Scan(&actor, &action, &outcome))
	require.Equal(t, []string{"alice", admin.ActionEndpointDisable, admin.OutcomeDone}, []string{actor, action, outcome})
}

func readAll(t *testing.T, res *http.Response) string {
	t.Helper()
	defer res.Body.Close()
	var sb strings.Builder
	_, err := io.Copy(&sb, res.Body)
	require.NoError(t, err)
	return sb.String()
}

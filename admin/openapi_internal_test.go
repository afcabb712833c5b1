package admin

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/receiver"
)

// docOperations returns "METHOD path" for every operation of an OpenAPI document, following
// path items given by reference.
func docOperations(t *testing.T, raw []byte) []string {
	t.Helper()
	var doc map[string]any
	require.NoError(t, yaml.Unmarshal(raw, &doc))
	require.True(t, strings.HasPrefix(doc["openapi"].(string), "3.1."), "an OpenAPI 3.1 document")
	checkRefs(t, doc, doc)
	var out []string
	for path, item := range doc["paths"].(map[string]any) {
		ops := item.(map[string]any)
		if ref, ok := ops["$ref"].(string); ok {
			ops = resolve(t, doc, ref).(map[string]any)
		}
		for method := range ops {
			switch method {
			case "get", "put", "post", "delete", "patch", "head", "options":
				out = append(out, strings.ToUpper(method)+" "+path)
			}
		}
	}
	sort.Strings(out)
	return out
}

func resolve(t *testing.T, doc map[string]any, ref string) any {
	t.Helper()
	require.True(t, strings.HasPrefix(ref, "#/"), "only local references: %s", ref)
	var node any = doc
	for _, part := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
		m, ok := node.(map[string]any)
		require.True(t, ok, "reference %s does not resolve", ref)
		node, ok = m[part]
		require.True(t, ok, "reference %s does not resolve", ref)
	}
	return node
}

// checkRefs fails on any $ref that does not resolve.
func checkRefs(t *testing.T, doc map[string]any, node any) {
	switch v := node.(type) {
	case map[string]any:
		for k, x := range v {
			if k == "$ref" {
				resolve(t, doc, x.(string))
				continue
			}
			checkRefs(t, doc, x)
		}
	case []any:
		for _, x := range v {
			checkRefs(t, doc, x)
		}
	}
}

// Every route of the admin server but the console's and pprof's is in admin.yaml, and every
// operation of admin.yaml is a route.
func TestAdminDocumentMatchesRoutes(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	s, err := New(db.Pool, &Config{Schema: db.Schema})
	require.NoError(t, err)
	var routes []string
	for _, r := range s.routes {
		if r.path == "/{$}" || strings.HasPrefix(r.path, "/ui/") || strings.HasPrefix(r.path, "/debug/pprof/") {
			continue
		}
		routes = append(routes, r.method+" "+r.path)
	}
	sort.Strings(routes)
	require.Equal(t, docOperations(t, AdminDocument()), routes)
}

// The receiver's document lists exactly the routes a receiver answers: every method and
// path that answers something other than 404 or 405 is documented, and every documented
// one answers.
func TestReceiverDocumentMatchesRoutes(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	sources := []receiver.Source{
		{Name: "stripe", Verify: receiver.Verify{Scheme: receiver.SchemeStripe, Secrets: []string{"whsec_test_0123456789abcdef"}}},
		{Name: "gh", Path: "/hooks/github", Verify: receiver.Verify{Scheme: receiver.SchemeGitHub, Secrets: []string{"github-secret-0123456789"}}},
		{Name: "orders", Path: "/v1/orders", Verify: receiver.Verify{Scheme: receiver.SchemeBearer, Tokens: map[string]string{"tok-0123456789abcdef": "acme"}},
			Idempotency: &receiver.Idempotency{Required: true}},
		{Name: "payments", Path: "/v1/payments", Verify: receiver.Verify{Scheme: receiver.SchemeBearer, Tokens: map[string]string{"tok-0123456789abcdef": "acme"}},
			Idempotency: &receiver.Idempotency{Lookup: true}, Delete: &receiver.Delete{SQL: "SELECT 1 WHERE @message_id::text IS NULL"}},
	}
	rcv, err := receiver.New(db.Pool, &receiver.Config{Schema: db.Schema, Sources: sources})
	require.NoError(t, err)
	t.Cleanup(rcv.Close)
	srv := httptest.NewServer(rcv)
	t.Cleanup(srv.Close)

	var answered []string
	for _, src := range sources {
		base := src.RoutePath()
		for _, path := range []string{base, base + "/some-key", "/elsewhere"} {
			for _, method := range []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"} {
				req, err := http.NewRequest(method, srv.URL+path, strings.NewReader("{}"))
				require.NoError(t, err)
				res, err := http.DefaultClient.Do(req)
				require.NoError(t, err)
				res.Body.Close()
				if res.StatusCode != http.StatusNotFound && res.StatusCode != http.StatusMethodNotAllowed {
					answered = append(answered, method+" "+strings.Replace(path, "/some-key", "/{key}", 1))
				}
			}
		}
	}
	slices.Sort(answered)
	answered = slices.Compact(answered)

	doc, err := ReceiverDocument(receiver.Routes(sources))
	require.NoError(t, err)
	require.Equal(t, answered, docOperations(t, doc))

	// The copy in the repository is the document of deploy/idemd.dev.yaml's sources.
	dev := []receiver.Source{
		{Name: "stripe", Verify: receiver.Verify{Scheme: receiver.SchemeStripe}},
		{Name: "orders", Path: "/v1/orders", Verify: receiver.Verify{Scheme: receiver.SchemeBearer}, Idempotency: &receiver.Idempotency{Required: true}},
	}
	devDoc, err := ReceiverDocument(receiver.Routes(dev))
	require.NoError(t, err)
	repo, _ := openapiFS.ReadFile("openapi/receiver.yaml")
	require.Equal(t, docOperations(t, devDoc), docOperations(t, repo))
}

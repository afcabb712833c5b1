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

// The receiver's document as served for webhook sources of every scheme (and API sources):
// each operation has its own operationId, and names the header its source's scheme reads;
// the note on the repository's copy is not in it.
func TestReceiverDocumentPerSource(t *testing.T) {
	t.Parallel()
	hook := func(name, scheme string) receiver.Source {
		return receiver.Source{Name: name, Verify: receiver.Verify{Scheme: scheme}}
	}
	custom := hook("custom", receiver.SchemeHMACSHA256)
	custom.Verify.Header = "X-Acme-Signature"
	sources := []receiver.Source{
		hook("stripe", receiver.SchemeStripe), hook("std", receiver.SchemeStandardWebhooks), hook("gh", receiver.SchemeGitHub),
		hook("shop", receiver.SchemeShopify), hook("slack", receiver.SchemeSlack), custom, hook("open", receiver.SchemeNone),
		{Name: "orders", Path: "/v1/orders", Verify: receiver.Verify{Scheme: receiver.SchemeBearer}, Idempotency: &receiver.Idempotency{Lookup: true}},
		{Name: "carts", Path: "/v1/carts", Verify: receiver.Verify{Scheme: receiver.SchemeBearer}, Idempotency: &receiver.Idempotency{}},
	}
	raw, err := ReceiverDocument(receiver.Routes(sources))
	require.NoError(t, err)
	require.Empty(t, lintOpenAPI(raw))
	require.NotContains(t, string(raw), "deploy/idemd.dev.yaml")
	docOperations(t, raw) // references resolve

	var doc struct {
		Paths      map[string]map[string]any `yaml:"paths"`
		Components struct {
			SecuritySchemes map[string]struct {
				In   string `yaml:"in"`
				Name string `yaml:"name"`
			} `yaml:"securitySchemes"`
		} `yaml:"components"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &doc))
	// signature header of the webhook path's scheme, and the other signed headers
	want := map[string][]string{
		"/webhooks/stripe": {"Stripe-Signature"},
		"/webhooks/std":    {"Webhook-Signature", "Webhook-Id", "Webhook-Timestamp"},
		"/webhooks/gh":     {"X-Hub-Signature-256"},
		"/webhooks/shop":   {"X-Shopify-Hmac-Sha256"},
		"/webhooks/slack":  {"X-Slack-Signature", "X-Slack-Request-Timestamp"},
		"/webhooks/custom": {"X-Acme-Signature"},
	}
	ids := map[string]string{}
	for path, item := range doc.Paths {
		for method, v := range item {
			if method == "summary" {
				continue
			}
			op := v.(map[string]any)
			id := op["operationId"].(string)
			require.NotContains(t, ids, id, "operationId of %s %s also on %s", method, path, ids[id])
			ids[id] = method + " " + path
			sec := op["security"].([]any)
			headers, webhook := want[path]
			switch {
			case path == "/webhooks/open":
				require.Empty(t, sec, "scheme none: no security")
			case !webhook:
				require.Equal(t, []any{map[string]any{"bearer": []any{}}}, sec, path)
			default:
				require.Len(t, sec, 1)
				var name string
				for name = range sec[0].(map[string]any) {
				}
				scheme := doc.Components.SecuritySchemes[name]
				require.Equal(t, "header", scheme.In, path)
				require.Equal(t, headers[0], scheme.Name, path)
				params := []string{}
				ps, _ := op["parameters"].([]any)
				for _, p := range ps {
					if pm, ok := p.(map[string]any); ok && pm["in"] == "header" {
						require.Equal(t, true, pm["required"], path)
						params = append(params, pm["name"].(string))
					}
				}
				require.Equal(t, headers[1:], params, "the other signed headers of %s", path)
			}
		}
	}
	require.Equal(t, "post /webhooks/gh", ids["deliverWebhook_gh"])
	require.Len(t, ids, 7+3+2)
}

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/pipeline"
	"github.com/idemd/idemd/receiver"
)

// TestExampleRequestsWorkAsPasted: the curl commands dev and sign print carry the header a
// source reads its message id from, and a bearer token only when it is dev's own; otherwise
// a line says which variable holds the tokens.
func TestExampleRequestsWorkAsPasted(t *testing.T) {
	t.Parallel()
	now := time.Unix(1700000000, 0)
	open := &receiver.Source{Name: "open", Verify: receiver.Verify{Scheme: "none"}, AllowUnverified: true,
		MessageID: &pipeline.Field{Header: "X-Id"}}
	line, err := exampleRequest(open, "http://127.0.0.1:8080", nil, "o1", now, false)
	require.NoError(t, err)
	require.Contains(t, line, `-H 'X-Id: o1'`)

	composite := &receiver.Source{Name: "gh", Verify: receiver.Verify{Scheme: "github", Secrets: []string{"github-secret-0123456789"}},
		MessageID: &pipeline.Field{Parts: []pipeline.Field{{Header: "X-GitHub-Delivery"}, {Header: "X-Tenant"}}}}
	line, err = exampleRequest(composite, "http://127.0.0.1:8080", nil, "d1", now, false)
	require.NoError(t, err)
	require.Contains(t, line, `-H 'X-Tenant: d1'`)
	require.Equal(t, 1, strings.Count(strings.ToLower(line), "x-github-delivery"), "the signature's own id header is not sent twice")

	orders := &receiver.Source{Name: "orders", Path: "/v1/orders", Idempotency: &receiver.Idempotency{Required: true},
		Verify: receiver.Verify{Scheme: "bearer", TokensEnv: "ORDERS_TOKENS", Tokens: map[string]string{"user-token-0123456789": "acme"}}}
	line, err = exampleRequest(orders, "http://127.0.0.1:8080", nil, "k1", now, false)
	require.NoError(t, err)
	require.NotContains(t, line, "user-token-0123456789", "a token the user set is not printed")
	comment, curl, _ := strings.Cut(line, "\n")
	require.Equal(t, `# set TOKEN to one of the tokens in ORDERS_TOKENS ("token=tenant,…") first`, comment)
	require.Contains(t, curl, `-H "Authorization: Bearer $TOKEN"`)
	line, err = exampleRequest(orders, "http://127.0.0.1:8080", nil, "k1", now, true)
	require.NoError(t, err)
	require.Contains(t, line, "Bearer user-token-0123456789", "dev's own development token is printed")
	require.NotContains(t, line, "# set TOKEN")
}

// TestSignDefaults: sign sends to IDEMD_HTTP_ADDR when it is set, adds the id header of a
// header-id source, and refuses extra arguments.
func TestSignDefaults(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "p.yaml")
	require.NoError(t, os.WriteFile(file, []byte("sources:\n  - name: open\n    verify: {scheme: none}\n    allow_unverified: true\n    message_id: {header: X-Id}\n"), 0o600))
	code, out, errOut := runIdemd(t, map[string]string{"IDEMD_HTTP_ADDR": ":18081", "IDEMD_PIPELINES_FILE": file}, "sign", "-source", "open", "-id", "o7")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "'http://127.0.0.1:18081/webhooks/open'")
	require.Contains(t, out, "-H 'X-Id: o7'")

	code, out, errOut = runIdemd(t, nil, "sign")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "'"+signURLDefault+"/webhooks/stripe'")
}

// TestSignSaysWhichFile: as dev, sign reads dev's pipelines unless a file is named, even where
// ./idemd.yaml exists; a source found only there is refused with how to name the file.
func TestSignSaysWhichFile(t *testing.T) {
	code, _, errOut := runIdemd(t, nil, "version") // the binary is built from the module's directory
	require.Equal(t, 0, code, errOut)
	t.Chdir(t.TempDir())
	require.NoError(t, os.WriteFile("idemd.yaml", []byte("sources:\n  - name: open\n    verify: {scheme: none}\n    allow_unverified: true\n    message_id: {header: X-Id}\n"), 0o600))
	code, _, errOut = runIdemd(t, nil, "sign", "-source", "open")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, `no source "open" in`)
	require.Contains(t, errOut, "idemd.yaml exists here: to sign for its sources, pass -pipelines idemd.yaml")
	code, out, errOut := runIdemd(t, nil, "sign", "-source", "open", "-pipelines", "idemd.yaml", "-id", "o8")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "-H 'X-Id: o8'")
}

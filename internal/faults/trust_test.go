package faults

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/proctest"
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

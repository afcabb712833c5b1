package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/receiver"
)

func TestHelpAndBadFlags(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{"serve", "dev", "migrate", "check", "sign", "version"} {
		code, out, _ := runIdemd(t, nil, cmd, "--help")
		require.Equal(t, 0, code, cmd)
		require.Contains(t, out, "Usage: idemd "+cmd, cmd)

		code, _, errOut := runIdemd(t, nil, cmd, "-no-such-flag")
		require.Equal(t, 2, code, cmd)
		require.Contains(t, errOut, "flag provided but not defined", cmd)
		// The error and where the help is, not the whole help: the error would scroll away.
		require.Contains(t, errOut, "see idemd "+cmd+" --help", cmd)
		require.NotContains(t, errOut, "Usage:", cmd)
		require.LessOrEqual(t, strings.Count(errOut, "\n"), 2, "%s:\n%s", cmd, errOut)

		code, _, errOut = runIdemd(t, nil, cmd, "extra")
		require.Equal(t, 2, code, cmd)
		require.Contains(t, errOut, `unexpected arguments ["extra"]`, cmd)
	}
	code, out, _ := runIdemd(t, nil, "dlq", "list", "--help")
	require.Equal(t, 0, code)
	require.Contains(t, out, "Usage: idemd dlq list")

	code, _, errOut := runIdemd(t, nil, "frobnicate")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `unknown command "frobnicate"`)

	code, _, errOut = runIdemd(t, map[string]string{"IDEMD_SHUTDOWN_TIMEOUT": "soon", "IDEMD_LOG_FORMAT": "xml", "IDEMD_ROLES": "receiver,janitor"}, "serve")
	require.Equal(t, 2, code)
	for _, want := range []string{"IDEMD_SHUTDOWN_TIMEOUT", "soon"} {
		require.Contains(t, errOut, want)
	}
	code, _, errOut = runIdemd(t, map[string]string{"IDEMD_LOG_FORMAT": "xml", "IDEMD_ROLES": "receiver,janitor"}, "serve")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `IDEMD_LOG_FORMAT: "xml"`)
	require.Contains(t, errOut, `unknown role "janitor"`)

	code, out, _ = runIdemd(t, nil, "version")
	require.Equal(t, 0, code)
	require.True(t, strings.HasPrefix(out, "idemd "))
}

// badFile is valid but for one problem per kind, replaced in by each case.
const goodFile = `sources:
  - name: stripe
    verify: {scheme: stripe, secrets_env: [CLI_STRIPE_SECRET], tolerance: 5m}
    effect: {sql: "SELECT @message_id::text"}
    retention: 30d
subscriptions:
  - name: ledger
    topics: [t]
    effect: {sql: "SELECT @payload::jsonb"}
`

// TestServeRefusesBadConfig: each kind of configuration error stops serve before it
// connects to anything, exit code 2, with a message naming file, line, pipeline and field.
func TestServeRefusesBadConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, old, new, want string }{
		{"unknown key", "retention: 30d", "retention: 30d\n    retries: 3", `:6: sources[0] "stripe": retries: unknown key`},
		{"unknown scheme", "scheme: stripe", "scheme: strype", `:3: sources[0] "stripe": verify.scheme: unknown scheme "strype"`},
		{"missing secret", "CLI_STRIPE_SECRET", "CLI_UNSET_SECRET", `:3: sources[0] "stripe": verify.secrets_env[0]: environment variable CLI_UNSET_SECRET is not set`},
		{"duplicate name", "name: ledger", "name: stripe", `:7: subscriptions[0] "stripe": name: duplicate name "stripe"`},
		{"bad duration", "retention: 30d", "retention: 30 days", `:5: sources[0] "stripe": retention: invalid duration "30 days"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			file := filepath.Join(t.TempDir(), "idemd.yaml")
			require.NoError(t, os.WriteFile(file, []byte(strings.Replace(goodFile, tc.old, tc.new, 1)), 0o600))
			code, _, errOut := runIdemd(t, map[string]string{
				"IDEMD_PIPELINES_FILE": file, "IDEMD_DATABASE_URL": "postgres://nobody@127.0.0.1:1/none",
				"IDEMD_KAFKA_BROKERS": "127.0.0.1:1", "CLI_STRIPE_SECRET": "whsec_cli_test_secret",
			}, "serve")
			require.Equal(t, 2, code, errOut)
			require.Contains(t, errOut, file+tc.want)
			require.NotContains(t, errOut, "whsec_cli_test_secret")
		})
	}
}

// TestCheckReportsEverything: `idemd check` reports every problem at once, SQL that does
// not prepare included, even when the file has other problems.
func TestCheckReportsEverything(t *testing.T) {
	t.Parallel()
	schema := testSchema(t)
	file := filepath.Join(t.TempDir(), "idemd.yaml")
	bad := strings.NewReplacer(
		"scheme: stripe", "scheme: strype",
		`SELECT @payload::jsonb`, `INSERT INTO no_such_table VALUES (@payload)`,
	).Replace(goodFile)
	require.NoError(t, os.WriteFile(file, []byte(bad), 0o600))
	code, _, errOut := runIdemd(t, map[string]string{
		"IDEMD_PIPELINES_FILE": file, "IDEMD_DATABASE_URL": pgtest.URL(), "IDEMD_DB_SCHEMA": schema,
		"IDEMD_KAFKA_BROKERS": "127.0.0.1:1", "CLI_STRIPE_SECRET": "whsec_cli_test_secret",
	}, "check")
	require.Equal(t, 2, code, errOut)
	require.Contains(t, errOut, file+`:3: sources[0] "stripe": verify.scheme: unknown scheme "strype"`)
	require.Contains(t, errOut, file+`:9: subscriptions[0] "ledger": effect.sql: does not prepare: ERROR: relation "no_such_table" does not exist`)
	require.Contains(t, errOut, "Kafka brokers")
}

// TestSignatureVectors: the signed examples dev prints use SPEC 3.1's algorithms.
func TestSignatureVectors(t *testing.T) {
	t.Parallel()
	at := time.Unix(1614265330, 0)
	for _, tc := range []struct {
		scheme, secret, id, body, header, want string
	}{
		{"stripe", "whsec_test_secret", "", `{"id":"evt_test_webhook","object":"event"}`, "Stripe-Signature",
			"t=1614265330,v1=3c5817089d739023dd6190f70a3757e04f7a2fd8b5dab12c2e000f51970dccff"},
		{"standard-webhooks", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek", `{"test": 2432232314}`,
			"webhook-signature", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="},
		{"github", "It's a Secret to Everybody", "d1", "Hello, World!", "X-Hub-Signature-256",
			"sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"},
		{"shopify", "hush", "e1", `{"id":123}`, "X-Shopify-Hmac-Sha256", "75DK9h3ZbLv2nIMppOFKPFxSYU9PgXvd4NXUhSs88Jk="},
	} {
		headers, err := signature(&receiver.Verify{Scheme: tc.scheme}, tc.secret, []byte(tc.body), tc.id, at)
		require.NoError(t, err, tc.scheme)
		got := ""
		for _, h := range headers {
			if h[0] == tc.header {
				got = h[1]
			}
		}
		require.Equal(t, tc.want, got, tc.scheme)
	}
}

// TestLogsEscapeSenderText: a log line quoting a sender's id (JSON or text format) carries
// no raw C1 control or bidirectional override, and JSON lines still decode to the id.
func TestLogsEscapeSenderText(t *testing.T) {
	t.Parallel()
	const id = "evt_\u009b2J\u202e\x1b[31m"
	for _, format := range []string{"json", "text"} {
		var buf bytes.Buffer
		log := newLogger(&Env{LogLevel: "info", LogFormat: format}, &buf)
		log.WithField("message_id", id).Info("webhook \u0085 verified")
		out := buf.String()
		for _, r := range out {
			require.False(t, r == 0x1b || (r >= 0x80 && r <= 0x9f) || r == 0x202e, "%s: raw %U in %q", format, r, out)
		}
		if format == "json" {
			var line map[string]any
			require.NoError(t, json.Unmarshal(buf.Bytes(), &line))
			require.Equal(t, id, line["message_id"])
		}
	}
}

package config

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestInvalidValuesRefused: each value the pipelines file refuses is an error that names the
// file, the line, the pipeline and the field (SPEC 2.3: the file is validated at start).
// Accepting every one of these values passed before: no test gave them, and a mutation
// audit removed each check without a test failing. Accepted, each changes what idemd does
// without a word: a redirect stored as the answer of every retry, two sources on one path
// (one of them never served), a bearer webhook source, deliveries to an ftp URL or unsigned,
// a subscription that dead-letters before its first attempt, a tolerance never applied, a
// retention of 0d that silently becomes the default, an unverified source nobody opted into.
func TestInvalidValuesRefused(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, file, from, to string
		line                 int
		pipeline, field, msg string
	}{
		{"status outside 2xx", valid, "status: 201", "status: 302",
			12, `sources[1] "orders"`, "effect.status", "302 is not a 2xx status"},
		{"two sources on one path", valid, "path: /v1/orders", "path: /webhooks/stripe",
			9, `sources[1] "orders"`, "path", `duplicate path "/webhooks/stripe": also sources[0] "stripe"`},
		{"bearer on a webhook source", valid, "    idempotency: {required: true, retention: 24h}\n", "",
			10, `sources[1] "orders"`, "verify.scheme", "bearer is for API sources"},
		{"http target not http", routing, `url: "https://erp.example/hooks"`, `url: "ftp://erp.example/hooks"`,
			9, `sources[0] "billing"`, "publish[1].http.url", "want an http:// or https:// URL"},
		{"http target without secret", routing, "secret_env: ERP_SECRET, rate: 50", "rate: 50",
			9, `sources[0] "billing"`, "publish[1].http.secret_env", "required"},
		{"dead letter after no attempt", valid, "max_attempts: 5}", "max_attempts: 0}",
			22, `subscriptions[0] "ledger"`, "dead_letter.max_attempts", "must be at least 1"},
		{"tolerance on a scheme without timestamp", valid, "scheme: stripe, secrets_env: [STRIPE_WEBHOOK_SECRET], tolerance: 5m",
			"scheme: github, secrets_env: [STRIPE_WEBHOOK_SECRET], tolerance: 5m",
			3, `sources[0] "stripe"`, "verify.tolerance", "scheme github signs no timestamp"},
		{"zero retention", valid, "retention: 30d", "retention: 0d",
			7, `sources[0] "stripe"`, "retention", "must be positive"},
		{"composite id nested with parts:", routing, "[{json: /data/object/id}, {json: /type}]", "[{json: /data/object/id}, {parts: [{json: /type}]}]",
			4, `sources[0] "billing"`, "message_id[1]", "a part is one json pointer or header, not a list"},
		{"composite id nested as a list", routing, "[{json: /data/object/id}, {json: /type}]", "[{json: /data/object/id}, [{json: /type}]]",
			4, `sources[0] "billing"`, "message_id[1]", "a part is one json pointer or header, not a list"},
		{"body effect without effect", valid, "    effect: {sql: \"INSERT INTO orders (tenant, body) VALUES (@tenant, @payload) RETURNING id\", status: 201}\n", "",
			12, `sources[1] "orders"`, "publish.body", "set effect.sql"},
		{"scheme none without allow_unverified", valid, "verify: {scheme: stripe, secrets_env: [STRIPE_WEBHOOK_SECRET], tolerance: 5m}",
			"verify: {scheme: none}\n    message_id: {json: /id}",
			3, `sources[0] "stripe"`, "verify.scheme", "set allow_unverified: true"},
		{"scheme none without message id", valid, "verify: {scheme: stripe, secrets_env: [STRIPE_WEBHOOK_SECRET], tolerance: 5m}",
			"verify: {scheme: none}\n    allow_unverified: true",
			2, `sources[0] "stripe"`, "message_id", "required for scheme none"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			require.Contains(t, c.file, c.from)
			_, err := Parse("x.yaml", []byte(strings.Replace(c.file, c.from, c.to, 1)), routingLookup)
			require.Error(t, err, "the file was accepted")
			requireNames(t, err, "x.yaml", c.line, c.pipeline, c.field, c.msg)
		})
	}
}

// TestSQLParameterInLiteralIgnored: an '@' inside an SQL string literal is text, not a named
// parameter, and does not make the file invalid. Looking for parameters inside literals
// passed before: no test SQL had an '@' in a literal.
func TestSQLParameterInLiteralIgnored(t *testing.T) {
	t.Parallel()
	content := strings.Replace(valid, "VALUES (@message_id, @payload)", "VALUES (@message_id || '@ledger', @payload)", 1)
	require.NotEqual(t, valid, content)
	_, err := Parse("x.yaml", []byte(content), lookup)
	require.NoError(t, err)
}

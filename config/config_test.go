package config

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/consumer"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/pipeline"
)

// valid is SPEC 2.3's example file, with the stripe SQL quoted: unquoted, its " #>>" would
// start a YAML comment (see TestUnquotedHashHint).
const valid = `sources:
  - name: stripe
    verify: {scheme: stripe, secrets_env: [STRIPE_WEBHOOK_SECRET], tolerance: 5m}
    effect:
      sql: "INSERT INTO payments (event_id, amount) VALUES (@message_id, (@payload::jsonb #>> '{data,object,amount}')::bigint)"
    publish: {topic: webhooks.stripe, key: {json: /data/object/id}}
    retention: 30d
  - name: orders
    path: /v1/orders
    verify: {scheme: bearer, tokens_env: ORDERS_TOKENS}
    idempotency: {required: true, retention: 24h}
    effect: {sql: "INSERT INTO orders (tenant, body) VALUES (@tenant, @payload) RETURNING id", status: 201}
    publish: {topic: orders.created, body: effect}
subscriptions:
  - name: ledger
    topics: [webhooks.stripe]
    group: idemd-ledger
    message_id: {header: operation-id}
    order: {entity: {json: /data/object/id}, version: {json: /created}}
    effect: {sql: "INSERT INTO ledger (event_id, body) VALUES (@message_id, @payload)"}
    publish: {topic: ledger.entries}
    dead_letter: {topic: ledger.dlq, max_attempts: 5}
    retention: 7d
`

var env = map[string]string{
	"STRIPE_WEBHOOK_SECRET": "whsec_test_secret",
	"ORDERS_TOKENS":         "tok_a_0123456789ab=acme,tok_b_0123456789ab=globex",
}

func lookup(name string) (string, bool) {
	v, ok := env[name]
	return v, ok
}

// write puts content in a file of its own and returns its path.
func write(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "idemd.yaml")
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	return path
}

// loadErr loads content and returns the error, which must be there.
func loadErr(t *testing.T, content string) (string, error) {
	t.Helper()
	path := write(t, content)
	_, err := Load(path, lookup)
	require.Error(t, err)
	return path, err
}

func TestLoadValid(t *testing.T) {
	t.Parallel()
	f, err := Load(write(t, valid), lookup)
	require.NoError(t, err)
	require.Len(t, f.Sources, 2)
	require.Len(t, f.Subscriptions, 1)

	stripe := f.Sources[0]
	require.Equal(t, "/webhooks/stripe", stripe.RoutePath())
	require.Equal(t, []string{"whsec_test_secret"}, stripe.Verify.Secrets)
	require.Equal(t, 30*24*time.Hour, stripe.Retention)
	require.Equal(t, 5*time.Minute, stripe.Verify.Tolerance)
	require.Len(t, stripe.Publish, 1, "publish: {…} is a list of one target")
	require.Equal(t, &pipeline.Field{JSON: "/data/object/id"}, stripe.Publish[0].Key)

	orders := f.Sources[1]
	require.Equal(t, map[string]string{"tok_a_0123456789ab": "acme", "tok_b_0123456789ab": "globex"}, orders.Verify.Tokens)
	require.Equal(t, 24*time.Hour, orders.Idempotency.Retention)
	require.Equal(t, 201, orders.Effect.Status)
	require.Equal(t, pipeline.BodyEffect, orders.Publish[0].Body)

	ledger := f.Subscriptions[0]
	require.Equal(t, "idemd-ledger", ledger.Group)
	require.Equal(t, 5, ledger.DeadLetter.MaxAttempts)
	require.Equal(t, "ledger.dlq", ledger.DeadLetter.Topic)
	require.Equal(t, 7*24*time.Hour, ledger.Retention)
	require.Equal(t, &pipeline.Order{Entity: pipeline.Field{JSON: "/data/object/id"}, Version: pipeline.Field{JSON: "/created"}}, ledger.Order)
	require.Equal(t, []string{"ledger.dlq", "ledger.entries", "orders.created", "webhooks.stripe"}, f.Topics())
}

// TestDefaults: what the file leaves out stays zero, for the doors to fill with their own
// defaults (one definition each); a single secrets_env name is a list of one.
func TestDefaults(t *testing.T) {
	t.Parallel()
	f, err := Parse("x.yaml", []byte(`
sources:
  - name: gh
    verify: {scheme: github, secrets_env: STRIPE_WEBHOOK_SECRET}
subscriptions:
  - name: sub
    topics: [a]
`), lookup)
	require.NoError(t, err)
	require.Zero(t, f.Sources[0].Retention)
	require.Equal(t, []string{"STRIPE_WEBHOOK_SECRET"}, f.Sources[0].Verify.SecretsEnv)
	require.Equal(t, "/webhooks/gh", f.Sources[0].RoutePath())
	require.Empty(t, f.Subscriptions[0].Group)
	require.Zero(t, f.Subscriptions[0].DeadLetter.MaxAttempts)
}

// requireNames checks that one line of err names the file, the line, the pipeline and the
// field, and says msg.
func requireNames(t *testing.T, err error, file string, line int, pipeline, field, msg string) {
	t.Helper()
	want := file + ":" + strconv.Itoa(line) + ": " + pipeline + ": " + field + ": "
	for _, l := range strings.Split(err.Error(), "\n") {
		if strings.HasPrefix(l, want) && strings.Contains(l, msg) {
			return
		}
	}
	t.Fatalf("no line starting %q and containing %q in:\n%v", want, msg, err)
}

func TestErrorUnknownKey(t *testing.T) {
	t.Parallel()
	path, err := loadErr(t, strings.Replace(valid, "tolerance: 5m}", "tolerance: 5m, secret: oops}", 1))
	requireNames(t, err, path, 3, `sources[0] "stripe"`, "verify.secret", "unknown key")
	// The secret-looking value is never echoed.
	require.NotContains(t, err.Error(), "oops")

	path, err = loadErr(t, strings.Replace(valid, "    retention: 7d\n", "    retention: 7d\n    retries: 3\n", 1))
	requireNames(t, err, path, 24, `subscriptions[0] "ledger"`, "retries", "unknown key")
}

func TestErrorUnknownScheme(t *testing.T) {
	t.Parallel()
	path, err := loadErr(t, strings.Replace(valid, "scheme: stripe", "scheme: strpe", 1))
	requireNames(t, err, path, 3, `sources[0] "stripe"`, "verify.scheme", `unknown scheme "strpe"`)
}

func TestErrorMissingSecret(t *testing.T) {
	t.Parallel()
	path, err := loadErr(t, strings.Replace(valid, "STRIPE_WEBHOOK_SECRET", "STRIPE_WEBHOOK_SECRET_UNSET", 1))
	requireNames(t, err, path, 3, `sources[0] "stripe"`, "verify.secrets_env[0]", "environment variable STRIPE_WEBHOOK_SECRET_UNSET is not set")

	path, err = loadErr(t, strings.Replace(valid, "ORDERS_TOKENS", "ORDERS_TOKENS_UNSET", 1))
	requireNames(t, err, path, 10, `sources[1] "orders"`, "verify.tokens_env", "ORDERS_TOKENS_UNSET is not set")
}

// parseWithTokens parses the valid file with its API source's token list set to tokens.
func parseWithTokens(tokens string) error {
	_, err := Parse("x.yaml", []byte(strings.Replace(valid, "ORDERS_TOKENS", "BAD_TOKENS", 1)), func(name string) (string, bool) {
		if name == "BAD_TOKENS" {
			return tokens, true
		}
		return lookup(name)
	})
	return err
}

func TestErrorTokensNeverEchoed(t *testing.T) {
	t.Parallel()
	err := parseWithTokens("supersecret-without-tenant")
	require.Error(t, err)
	require.Contains(t, err.Error(), "verify.tokens_env")
	require.NotContains(t, err.Error(), "supersecret")
}

// TestErrorTokensAllReported: a token list with a malformed entry and a short token reports
// both in one run, never the tokens themselves.
func TestErrorTokensAllReported(t *testing.T) {
	t.Parallel()
	err := parseWithTokens("short=alice,garbage-entry-0123456789")
	require.Error(t, err)
	require.Contains(t, err.Error(), "entry 2 is not token=tenant")
	require.Contains(t, err.Error(), `the token of tenant "alice"`)
	require.NotContains(t, err.Error(), "garbage-entry")
	require.NotContains(t, err.Error(), "short=")
}

func TestErrorDuplicateName(t *testing.T) {
	t.Parallel()
	path, err := loadErr(t, strings.Replace(valid, "name: ledger", "name: stripe", 1))
	requireNames(t, err, path, 15, `subscriptions[0] "stripe"`, "name", `duplicate name "stripe": also sources[0] "stripe"`)
}

func TestErrorBadDuration(t *testing.T) {
	t.Parallel()
	path, err := loadErr(t, strings.Replace(valid, "retention: 30d", "retention: 30days", 1))
	requireNames(t, err, path, 7, `sources[0] "stripe"`, "retention", `invalid duration "30days"`)

	path, err = loadErr(t, strings.Replace(valid, "retention: 24h}", "retention: -1h}", 1))
	requireNames(t, err, path, 11, `sources[1] "orders"`, "idempotency.retention", "invalid duration")
}

func TestErrorBadType(t *testing.T) {
	t.Parallel()
	path, err := loadErr(t, strings.Replace(valid, "status: 201", "status: created", 1))
	requireNames(t, err, path, 12, `sources[1] "orders"`, "effect.status", "cannot unmarshal")
}

func TestErrorUnknownSQLParameter(t *testing.T) {
	t.Parallel()
	path, err := loadErr(t, strings.Replace(valid, "(@message_id, @payload)", "(@message_id, @body)", 1))
	requireNames(t, err, path, 20, `subscriptions[0] "ledger"`, "effect.sql", "unknown parameter @body")
}

// TestErrorsAllAtOnce: every problem of the file is reported, not only the first.
func TestErrorsAllAtOnce(t *testing.T) {
	t.Parallel()
	bad := strings.NewReplacer(
		"scheme: stripe", "scheme: strpe",
		"ORDERS_TOKENS", "ORDERS_TOKENS_UNSET",
		"name: ledger", "name: orders",
		"retention: 7d", "retention: 7 days",
		"    group: idemd-ledger\n", "    group: idemd-ledger\n    colour: blue\n",
	).Replace(valid)
	path, err := loadErr(t, bad)
	requireNames(t, err, path, 3, `sources[0] "stripe"`, "verify.scheme", "unknown scheme")
	requireNames(t, err, path, 10, `sources[1] "orders"`, "verify.tokens_env", "is not set")
	requireNames(t, err, path, 15, `subscriptions[0] "orders"`, "name", "duplicate name")
	requireNames(t, err, path, 18, `subscriptions[0] "orders"`, "colour", "unknown key")
	requireNames(t, err, path, 24, `subscriptions[0] "orders"`, "retention", "invalid duration")
	require.Len(t, strings.Split(err.Error(), "\n"), 5)
	var e *Error
	require.True(t, errors.As(err, &e))
}

func TestErrorFileLevel(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ content, msg string }{
		{"", "empty"},
		{"sources: [", "not valid YAML"},
		{"pipelines: []\n", "unknown key"},
		{"sources: []\n", "no pipelines"},
	} {
		_, err := Parse("x.yaml", []byte(tc.content), lookup)
		require.ErrorContains(t, err, tc.msg, tc.content)
		require.True(t, strings.HasPrefix(err.Error(), "x.yaml"), err.Error())
	}
}

// TestSyntaxErrorLine: a YAML syntax error is reported on the line where it is, with the
// line where the broken construct began, not on the line before (yaml/v3's own report).
func TestSyntaxErrorLine(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, content, want string }{
		{"unclosed flow mapping", "sources:\n  - name: a\n    verify: {scheme: none\n    allow_unverified: true\n",
			"x.yaml:4: not valid YAML: did not find expected ',' or '}' (in a flow mapping that starts on line 3)"},
		{"bad indentation", "sources:\n  - name: a\n    verify: {scheme: none}\n   allow_unverified: true\n",
			"x.yaml:4: not valid YAML: did not find expected '-' indicator (in a block collection that starts on line 2)"},
		{"tab", "sources:\n  - name: a\n\tverify: x\n",
			"x.yaml:3: not valid YAML: found a tab character that violates indentation"},
		{"unclosed quote", "sources:\n  - name: \"a\n    path: x\n",
			"(in a quoted scalar that starts on line 2)"},
	} {
		_, err := Parse("x.yaml", []byte(tc.content), lookup)
		require.ErrorContains(t, err, tc.want, tc.name)
	}
}

func TestErrorSQLDoesNotPrepare(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWithOptions(t, pgtest.Options{MaxConns: 2})
	db.Exec(t, db.Q(`CREATE TABLE {schema}.ledger (event_id text PRIMARY KEY, body jsonb)`))
	content := strings.ReplaceAll(valid, "INTO ledger", "INTO "+db.Schema+".ledger")
	f, err := Load(write(t, content), lookup)
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = f.PrepareSQL(ctx, db.Pool)
	require.Error(t, err)
	// payments and orders do not exist in the test database; ledger prepares.
	requireNames(t, err, f.Path, 5, `sources[0] "stripe"`, "effect.sql", `does not prepare: ERROR: relation "payments" does not exist`)
	requireNames(t, err, f.Path, 12, `sources[1] "orders"`, "effect.sql", `does not prepare: ERROR: relation "orders" does not exist`)
	require.NotContains(t, err.Error(), "ledger")

	db.Exec(t, db.Q(`CREATE TABLE {schema}.payments (event_id text PRIMARY KEY, amount bigint)`))
	db.Exec(t, db.Q(`CREATE TABLE {schema}.orders (id bigserial PRIMARY KEY, tenant text, body jsonb)`))
	content = strings.NewReplacer("INTO payments", "INTO "+db.Schema+".payments", "INTO orders", "INTO "+db.Schema+".orders").Replace(content)
	f, err = Load(write(t, content), lookup)
	require.NoError(t, err)
	require.NoError(t, f.PrepareSQL(ctx, db.Pool))
}

// TestUnquotedHashHint: SPEC 2.3's example, verbatim, cuts its SQL at " #>>"; the error says
// why.
func TestUnquotedHashHint(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWithOptions(t, pgtest.Options{MaxConns: 1})
	content := `sources:
  - name: stripe
    verify: {scheme: stripe, secrets_env: [STRIPE_WEBHOOK_SECRET]}
    effect:
      sql: INSERT INTO payments (event_id, amount) VALUES (@message_id, (@payload::jsonb #>> '{data,object,amount}')::bigint)
`
	f, err := Parse("x.yaml", []byte(content), lookup)
	require.NoError(t, err)
	err = f.PrepareSQL(context.Background(), db.Pool)
	requireNames(t, err, "x.yaml", 5, `sources[0] "stripe"`, "effect.sql", "quote the SQL")
}

// TestShortKeysRefused: a signing secret or bearer token shorter than 16 bytes once decoded
// (an empty standard-webhooks key "whsec_" above all) is a validation error naming the file,
// the pipeline and the field, and never the value.
func TestShortKeysRefused(t *testing.T) {
	t.Parallel()
	file := `sources:
  - name: sw
    verify: {scheme: standard-webhooks, secrets_env: [SW_EMPTY]}
  - name: gh
    verify: {scheme: github, secrets_env: [GH_OK, GH_SHORT]}
  - name: api
    verify: {scheme: bearer, tokens_env: API_TOKENS}
    idempotency: {}
    publish: {http: {url: "https://example.com/hook", secret_env: SINK_SHORT}}
`
	vars := map[string]string{
		"SW_EMPTY": "whsec_", "GH_OK": "github-secret-0123456789", "GH_SHORT": "gh-short-15byte",
		"API_TOKENS": "tok-short-15byt=acme,tok-long-0123456789=globex", "SINK_SHORT": "whsec_c2hvcnQ=",
	}
	path := write(t, file)
	_, err := Load(path, func(n string) (string, bool) { v, ok := vars[n]; return v, ok })
	require.Error(t, err)
	requireNames(t, err, path, 3, `sources[0] "sw"`, "verify.secrets_env[0]", "environment variable SW_EMPTY: the key is shorter than 16 bytes")
	requireNames(t, err, path, 5, `sources[1] "gh"`, "verify.secrets_env[1]", "environment variable GH_SHORT: the key is shorter than 16 bytes")
	requireNames(t, err, path, 7, `sources[2] "api"`, "verify.tokens_env", `the token of tenant "acme": the key is shorter than 16 bytes`)
	requireNames(t, err, path, 9, `sources[2] "api"`, "publish.http.secret_env", "environment variable SINK_SHORT: the key is shorter than 16 bytes")
	require.Len(t, strings.Split(err.Error(), "\n"), 4, "%v", err)
	for _, v := range []string{"gh-short-15byte", "tok-short-15byt", "c2hvcnQ="} {
		require.NotContains(t, err.Error(), v)
	}
}

// TestHeaderIDOnHMACIsOptIn: message_id.header on an hmac-sha256 source (whose signature
// covers the body only) needs allow_unsigned_message_id: true, which no other source takes.
func TestHeaderIDOnHMACIsOptIn(t *testing.T) {
	t.Parallel()
	src := `sources:
  - name: generic
    verify: {scheme: hmac-sha256, secrets_env: [STRIPE_WEBHOOK_SECRET], header: X-Signature}
    message_id: {header: X-Id}
`
	path, err := loadErr(t, src)
	requireNames(t, err, path, 4, `sources[0] "generic"`, "message_id.header", "allow_unsigned_message_id: true")
	_, err = Load(write(t, src+"    allow_unsigned_message_id: true\n"), lookup)
	require.NoError(t, err)
	_, err = Load(write(t, strings.Replace(src, "{header: X-Id}", "{json: /id}", 1)), lookup)
	require.NoError(t, err, "an id inside the signed body")
	path, err = loadErr(t, strings.Replace(valid, "    retention: 30d\n", "    retention: 30d\n    allow_unsigned_message_id: true\n", 1))
	requireNames(t, err, path, 8, `sources[0] "stripe"`, "allow_unsigned_message_id", "only for verify.scheme hmac-sha256")
}

const brokers = `subscriptions:
  - name: gcp-orders
    pubsub: {subscription: orders-idemd, project: shop}
    message_id: {attribute: operation-id}
    order: {entity: {attribute: order}, version: {json: /version}}
    effect: {sql: "INSERT INTO orders_applied (id, body) VALUES (@message_id, @payload)"}
    publish: {topic: orders.applied, key: {key: true}}
  - name: aws-payments
    sqs: {queue: payments.fifo}
    message_id: [{attribute: tenant}, {json: /id}]
    dead_letter: {max_attempts: 3}
    publish: {topic: payments.applied, key: {attribute: tenant}}
  - name: aws-default-id
    sqs: {queue: "https://sqs.eu-west-1.amazonaws.com/123456789012/refunds"}
`

// TestBrokerSubscriptions: pubsub: and sqs: subscriptions load into consumer.Config with
// their door; message ids read attributes.
func TestBrokerSubscriptions(t *testing.T) {
	t.Parallel()
	f, err := Load(write(t, brokers), lookup)
	require.NoError(t, err)
	require.Len(t, f.Subscriptions, 3)
	gcp, aws, def := f.Subscriptions[0], f.Subscriptions[1], f.Subscriptions[2]
	require.Equal(t, "pubsub", gcp.Door())
	require.Equal(t, &consumer.PubSub{Subscription: "orders-idemd", Project: "shop"}, gcp.PubSub)
	require.Equal(t, "operation-id", gcp.MessageID.Attribute)
	require.Equal(t, "order", gcp.Order.Entity.Attribute)
	require.Equal(t, "sqs", aws.Door())
	require.Equal(t, "payments.fifo", aws.SQS.Queue)
	require.Equal(t, []pipeline.Field{{Attribute: "tenant"}, {JSON: "/id"}}, aws.MessageID.Parts)
	require.Equal(t, &pipeline.Field{Attribute: "tenant"}, aws.Publish[0].Key, "a broker's event keyed by an attribute")
	require.Nil(t, def.MessageID, "the broker's message id")
	require.Equal(t, []string{"orders.applied", "payments.applied"}, f.Topics(), "brokers' sources are not Kafka topics, their targets are")
}

// TestBrokerSubscriptionErrors: one source per subscription, attributes on broker doors and
// headers on Kafka, each error naming file, line, pipeline and field.
func TestBrokerSubscriptionErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, old, new  string
		line            int
		pipeline, field string
		msg             string
	}{
		{"no source", "    sqs: {queue: payments.fifo}\n", "", 8, `subscriptions[1] "aws-payments"`, "topics", "required: name the source"},
		{"two sources", "    sqs: {queue: payments.fifo}\n", "    sqs: {queue: payments.fifo}\n    topics: [payments]\n", 9, `subscriptions[1] "aws-payments"`, "sqs", "reads one source, and topics is given too"},
		{"header id on sqs", "message_id: [{attribute: tenant}", "message_id: [{header: tenant}", 10, `subscriptions[1] "aws-payments"`, "message_id[0].header", "attributes, not headers"},
		{"header id on pubsub", "message_id: {attribute: operation-id}", "message_id: {header: operation-id}", 4, `subscriptions[0] "gcp-orders"`, "message_id.header", "use attribute"},
		{"header order on pubsub", "entity: {attribute: order}", "entity: {header: order}", 5, `subscriptions[0] "gcp-orders"`, "order.entity.header", "attributes, not headers"},
		{"header key on pubsub", "key: {key: true}", "key: {header: k}", 7, `subscriptions[0] "gcp-orders"`, "publish.key.header", "attributes, not headers"},
		{"header key on sqs", "key: {attribute: tenant}", "key: {header: tenant}", 12, `subscriptions[1] "aws-payments"`, "publish.key.header", "use attribute"},
		{"group on pubsub", "    pubsub: {subscription: orders-idemd, project: shop}\n", "    pubsub: {subscription: orders-idemd, project: shop}\n    group: g\n", 4, `subscriptions[0] "gcp-orders"`, "group", "only Kafka subscriptions"},
		{"no subscription", "pubsub: {subscription: orders-idemd, project: shop}", "pubsub: {project: shop}", 3, `subscriptions[0] "gcp-orders"`, "pubsub.subscription", "required"},
		{"full name and project", "subscription: orders-idemd, project: shop", "subscription: projects/a/subscriptions/b, project: shop", 3, `subscriptions[0] "gcp-orders"`, "pubsub.project", "full name"},
		{"no queue", "sqs: {queue: payments.fifo}", "sqs: {}", 9, `subscriptions[1] "aws-payments"`, "sqs.queue", "required"},
		// The outbox encodes Pub/Sub and SQS destinations as "pubsub:…" and "sqs:…": a dead
		// letter topic is a Kafka topic, and such a name would send the letters elsewhere.
		{"dead letter topic not Kafka's", "dead_letter: {max_attempts: 3}", `dead_letter: {topic: "sqs:refunds", max_attempts: 3}`, 11, `subscriptions[1] "aws-payments"`, "dead_letter.topic", `"sqs:refunds" is not a Kafka topic`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Contains(t, brokers, tc.old)
			path, err := loadErr(t, strings.Replace(brokers, tc.old, tc.new, 1))
			requireNames(t, err, path, tc.line, tc.pipeline, tc.field, tc.msg)
		})
	}

	// An attribute on a Kafka subscription.
	path, err := loadErr(t, strings.Replace(valid, "message_id: {header: operation-id}", "message_id: {attribute: operation-id}", 1))
	requireNames(t, err, path, 18, `subscriptions[0] "ledger"`, "message_id.attribute", "only Pub/Sub and SQS subscriptions have message attributes")
}

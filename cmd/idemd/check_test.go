package main

import (
	"maps"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/kafkatest"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/internal/proctest"
	"github.com/idemd/idemd/internal/pubsubtest"
	"github.com/idemd/idemd/internal/sqstest"
	"github.com/idemd/idemd/migrations"
)

// TestCheckAgreesWithServe: for each configuration, `idemd check` exits 0 exactly when
// `idemd serve` starts and becomes ready, both ways: every configuration check accepts is
// served, and every one it refuses is refused by serve too.
func TestCheckAgreesWithServe(t *testing.T) {
	t.Parallel()
	brokers := strings.Join(kafkatest.Brokers(t), ",")
	topic := func() string { return kafkatest.Name(t, "check") }
	sourcesOnly := func(publish string) string {
		return "sources:\n  - name: stripe\n    verify: {scheme: stripe, secrets_env: [CLI_STRIPE_SECRET]}\n    publish: {topic: " + publish + "}\n"
	}
	withSubscription := func(in string) string {
		return sourcesOnly(topic()) + "subscriptions:\n  - name: ledger\n    topics: [" + in + "]\n"
	}
	// Pub/Sub and SQS: the fakes of the tests, with a subscription and a queue that exist.
	psTopic := pubsubtest.Topic(t)
	psSub := pubsubtest.Subscription(t, psTopic, pubsubtest.SubscriptionConfig{})
	queue := sqstest.Queue(t, nil)
	pubsubEnv := map[string]string{"IDEMD_ROLES": "consumer,relay", "PUBSUB_EMULATOR_HOST": pubsubtest.Addr(t)}
	sqsEnv := map[string]string{"IDEMD_ROLES": "consumer,relay", "AWS_ENDPOINT_URL_SQS": sqstest.Endpoint(t),
		"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
		"AWS_CONFIG_FILE": "/nonexistent/aws-config", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials"}
	with := func(base map[string]string, kv ...string) map[string]string {
		m := maps.Clone(base)
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	pubsubSub := func(name string) string {
		return "subscriptions:\n  - name: gcp\n    pubsub: {subscription: " + name + "}\n    publish: {pubsub: {topic: " + psTopic + "}}\n"
	}
	sqsSub := func(queue string) string {
		return "subscriptions:\n  - name: aws\n    sqs: {queue: " + queue + "}\n"
	}
	// A port another process holds, for the whole test.
	held, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = held.Close() })
	for _, tc := range []struct {
		name   string
		file   string
		vars   map[string]string
		starts bool
		warns  string // a warning check prints, if any
		says   string // what check's refusal says, if it matters
		newer  bool   // the schema was migrated by a later idemd (its version one past this one's)
	}{
		{name: "receiver only, no brokers", file: withSubscription(topic()),
			vars: map[string]string{"IDEMD_ROLES": "receiver"}, starts: true},
		{name: "relay without brokers", file: sourcesOnly(topic()),
			vars: map[string]string{}, starts: false},
		{name: "consumer without brokers", file: withSubscription(topic()),
			vars: map[string]string{"IDEMD_ROLES": "receiver,consumer"}, starts: false},
		{name: "missing topics created at start", file: withSubscription(topic()),
			vars: map[string]string{"IDEMD_KAFKA_BROKERS": brokers, "IDEMD_KAFKA_CREATE_TOPICS": "true"}, starts: true},
		{name: "missing topics, not created", file: withSubscription(topic()),
			vars: map[string]string{"IDEMD_KAFKA_BROKERS": brokers}, starts: true, warns: "do not exist"},
		{name: "unreachable brokers, topics to create", file: sourcesOnly(topic()),
			vars: map[string]string{"IDEMD_KAFKA_BROKERS": "127.0.0.1:1", "IDEMD_KAFKA_CREATE_TOPICS": "true"}, starts: false},
		{name: "unreachable brokers", file: sourcesOnly(topic()),
			vars: map[string]string{"IDEMD_KAFKA_BROKERS": "127.0.0.1:1"}, starts: true, warns: "do not answer"},
		{name: "TLS key missing", file: sourcesOnly(topic()),
			vars: map[string]string{"IDEMD_ROLES": "receiver", "IDEMD_TLS_CERT_FILE": "/nonexistent/cert.pem"}, starts: false},
		{name: "retention shorter than the sender retries", file: strings.Replace(sourcesOnly(topic()), "    publish:", "    retention: 1d\n    publish:", 1),
			vars: map[string]string{"IDEMD_ROLES": "receiver"}, starts: true,
			warns: `sources[0] "stripe": retention: 1d is shorter than how long stripe retries a webhook (3d)`},
		{name: "receiver address held by another process", file: sourcesOnly(topic()),
			vars: map[string]string{"IDEMD_ROLES": "receiver", "IDEMD_HTTP_ADDR": held.Addr().String()}, starts: false},
		{name: "receiver address without a port", file: sourcesOnly(topic()),
			vars: map[string]string{"IDEMD_ROLES": "receiver", "IDEMD_HTTP_ADDR": "notanaddr"}, starts: false},
		{name: "pool too small", file: sourcesOnly(topic()),
			vars: map[string]string{"IDEMD_ROLES": "receiver", "IDEMD_DB_MAX_CONNS": "1"}, starts: false},
		{name: "tracing on", file: sourcesOnly(topic()),
			vars: map[string]string{"IDEMD_ROLES": "receiver", "OTEL_TRACES_EXPORTER": "console", "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.5"}, starts: true},
		{name: "pubsub subscription and topic", file: pubsubSub(pubsubtest.ID(psSub)),
			vars: with(pubsubEnv, "PUBSUB_PROJECT_ID", pubsubtest.Project), starts: true},
		{name: "pubsub subscription named in full, no project", file: pubsubSub(psSub),
			vars: pubsubEnv, starts: true},
		{name: "pubsub subscription without a project", file: pubsubSub(pubsubtest.ID(psSub)),
			vars: pubsubEnv, starts: false},
		{name: "pubsub subscription that does not exist", file: pubsubSub(pubsubtest.SubscriptionName("nonexistent-subscription")),
			vars: pubsubEnv, starts: false},
		{name: "sqs queue", file: sqsSub(queue),
			vars: with(sqsEnv, "AWS_REGION", "us-east-1"), starts: true},
		{name: "sqs without a region", file: sqsSub(queue),
			vars: sqsEnv, starts: false},
		{name: "sqs queue that does not exist", file: sqsSub("nonexistent-queue"),
			vars: with(sqsEnv, "AWS_REGION", "us-east-1"), starts: false, says: `subscription "aws": the SQS queue nonexistent-queue does not exist`},
		{name: "schema migrated by a later idemd", file: sourcesOnly(topic()), newer: true,
			vars: map[string]string{"IDEMD_ROLES": "receiver"}, starts: false, says: "past this idemd's last migration"},
		{name: "schema migrated by a later idemd, IDEMD_MIGRATE=false", file: sourcesOnly(topic()), newer: true,
			vars: map[string]string{"IDEMD_ROLES": "receiver", "IDEMD_MIGRATE": "false"}, starts: true, warns: "migrated by a later idemd"},
		{name: "tracing with an unknown sampler", file: sourcesOnly(topic()),
			vars: map[string]string{"IDEMD_ROLES": "receiver", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_SAMPLER": "sometimes"}, starts: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			file := filepath.Join(t.TempDir(), "idemd.yaml")
			require.NoError(t, os.WriteFile(file, []byte(tc.file), 0o600))
			vars := map[string]string{
				"IDEMD_PIPELINES_FILE": file, "IDEMD_DATABASE_URL": pgtest.URL(), "IDEMD_DB_SCHEMA": testSchema(t),
				"IDEMD_DB_MAX_CONNS": "4", "CLI_STRIPE_SECRET": "whsec_check_agrees_with_serve",
				"IDEMD_HTTP_ADDR": proctest.FreeAddr(t), "IDEMD_ADMIN_ADDR": proctest.FreeAddr(t),
			}
			maps.Copy(vars, tc.vars)
			if tc.newer {
				pool := pgtest.Pool(t, 1)
				cfg := &migrations.Config{Schema: vars["IDEMD_DB_SCHEMA"]}
				require.NoError(t, migrations.Apply(t.Context(), pool, cfg))
				_, err := pool.Exec(t.Context(), "UPDATE "+pgx.Identifier{cfg.Schema}.Sanitize()+".schema_version SET version = version + 1")
				require.NoError(t, err)
			}

			code, out, errOut := runIdemd(t, vars, "check")
			if tc.starts {
				require.Equal(t, 0, code, "check refuses a configuration serve starts with:\n%s", errOut)
				require.Contains(t, out, "serve would start")
			} else {
				require.Equal(t, 2, code, "check accepts a configuration serve refuses:\n%s%s", out, errOut)
				require.Contains(t, errOut, tc.says)
			}
			if tc.warns != "" {
				require.Regexp(t, `(?m)^warning: .*`+regexp.QuoteMeta(tc.warns), errOut, "a line that starts warning: (SPEC 2.3b)")
			} else {
				require.NotContains(t, errOut, "warning: ")
			}

			p := startIdemd(t, vars, "serve")
			err := p.WaitReady(vars["IDEMD_ADMIN_ADDR"], 60*time.Second)
			if tc.starts {
				require.NoError(t, err, "serve:\n%s", p.Stderr())
				require.Equal(t, 0, p.Stop(t, 30*time.Second))
			} else {
				require.ErrorContains(t, err, "exited before", "serve:\n%s", p.Stderr())
				require.NotZero(t, p.ExitCode())
			}
		})
	}
}

// TestCheckPlainWords: check reports every problem of the environment together with the
// pipelines file's, naming variables and values in plain words, never Go types.
func TestCheckPlainWords(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "idemd.yaml")
	require.NoError(t, os.WriteFile(file, []byte("sources:\n  - name: a\n    verify: {scheme: none\n    allow_unverified: true\n"), 0o600))
	code, _, errOut := runIdemd(t, map[string]string{
		"IDEMD_PIPELINES_FILE":    file,
		"IDEMD_DATABASE_URL":      pgtest.URL(),
		"IDEMD_DB_SCHEMA":         testSchema(t),
		"IDEMD_SHUTDOWN_TIMEOUT":  "soon",
		"IDEMD_DB_MAX_CONNS":      "many",
		"IDEMD_MIGRATE":           "maybe",
		"IDEMD_LOG_LEVEL":         "loud",
		"IDEMD_ROLES":             "receiver,janitor",
		"OTEL_TRACES_EXPORTER":    "zipkin",
		"OTEL_TRACES_SAMPLER":     "traceidratio",
		"OTEL_TRACES_SAMPLER_ARG": "half",
	}, "check")
	require.Equal(t, 2, code)
	for _, want := range []string{
		`IDEMD_SHUTDOWN_TIMEOUT: "soon" is not a duration (such as 500ms, 30s, 5m or 24h)`,
		`IDEMD_DB_MAX_CONNS: "many" is not a whole number`,
		`IDEMD_MIGRATE: "maybe" is not true or false`,
		`IDEMD_LOG_LEVEL: "loud" is not a level (trace, debug, info, warning, error)`,
		`IDEMD_ROLES: unknown role "janitor"`,
		`OTEL_TRACES_EXPORTER: "zipkin" is not supported (otlp, console or none)`,
		`OTEL_TRACES_SAMPLER_ARG: "half" is not a ratio between 0 and 1`,
		file + `:4: not valid YAML: did not find expected ',' or '}' (in a flow mapping that starts on line 3)`,
	} {
		require.Contains(t, errOut, want)
	}
	for _, goType := range []string{"time.Duration", "int32", "bool", "[]string"} {
		require.NotContains(t, errOut, goType)
	}
	require.Len(t, linesWith(errOut, "janitor"), 1, "each problem once:\n%s", errOut)
	require.NotContains(t, errOut, "IDEMD_MIGRATE=false", "an invalid IDEMD_MIGRATE is not reported as false")

	// migrate reads none of the broken variables but the database's: it is not stopped by them.
	code, _, errOut = runIdemd(t, map[string]string{"IDEMD_SHUTDOWN_TIMEOUT": "soon", "IDEMD_DB_MAX_CONNS": "many", "OTEL_TRACES_EXPORTER": "zipkin"}, "migrate")
	require.Equal(t, 2, code)
	require.Equal(t, "idemd migrate: IDEMD_DATABASE_URL is required\n", errOut)
}

// TestCheckNoWarningFromInvalidPoolSize: an IDEMD_DB_MAX_CONNS that does not parse, or is
// refused, is reported once, as an error; the pool warning is not made up from the zero (or
// refused) value it leaves behind.
func TestCheckNoWarningFromInvalidPoolSize(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "idemd.yaml")
	require.NoError(t, os.WriteFile(file, []byte("subscriptions:\n  - name: ledger\n    topics: [ledger]\n"), 0o600))
	for value, says := range map[string]string{
		"many": `IDEMD_DB_MAX_CONNS: "many" is not a whole number`,
		"1":    "IDEMD_DB_MAX_CONNS: 1 is too small",
	} {
		code, _, errOut := runIdemd(t, map[string]string{
			"IDEMD_PIPELINES_FILE": file, "IDEMD_DATABASE_URL": pgtest.URL(), "IDEMD_DB_SCHEMA": testSchema(t),
			"IDEMD_ROLES": "consumer", "IDEMD_KAFKA_BROKERS": "127.0.0.1:1",
			"IDEMD_HTTP_ADDR": proctest.FreeAddr(t), "IDEMD_ADMIN_ADDR": proctest.FreeAddr(t),
			"IDEMD_DB_MAX_CONNS": value,
		}, "check")
		require.Equal(t, 2, code, errOut)
		require.Contains(t, errOut, says)
		require.NotContains(t, errOut, "connections, and the subscriptions apply", "a warning made up from an invalid value:\n%s", errOut)
	}
}

// TestCheckListenAddresses: check reports, with the other problems and naming the variable,
// a listen address that does not parse and one that another process holds; an address a
// role does not use is only parsed. A misspelled variable is a warning, with the name it
// probably meant.
func TestCheckListenAddresses(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "idemd.yaml")
	require.NoError(t, os.WriteFile(file, []byte("sources:\n  - name: a\n    verify: {scheme: none}\n    allow_unverified: true\n    message_id: {header: X-Id}\n"), 0o600))
	held, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer held.Close()
	base := map[string]string{
		"IDEMD_PIPELINES_FILE": file, "IDEMD_DATABASE_URL": pgtest.URL(), "IDEMD_DB_SCHEMA": testSchema(t),
		"IDEMD_ROLES": "receiver", "IDEMD_HTTP_ADDR": proctest.FreeAddr(t), "IDEMD_ADMIN_ADDR": proctest.FreeAddr(t),
	}
	with := func(kv ...string) map[string]string {
		m := maps.Clone(base)
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	code, out, errOut := runIdemd(t, with("IDEMD_HTTP_ADR", ":8081"), "check")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "serve would start")
	require.Contains(t, errOut, "warning: IDEMD_HTTP_ADR is not a variable idemd reads, and is ignored; did you mean IDEMD_HTTP_ADDR?")

	code, _, errOut = runIdemd(t, with("IDEMD_HTTP_ADDR", "notanaddr", "IDEMD_ADMIN_ADDR", held.Addr().String(), "IDEMD_LOG_LEVEL", "loud"), "check")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "error listening on IDEMD_HTTP_ADDR notanaddr: listen tcp: address notanaddr: missing port in address")
	require.Contains(t, errOut, "error listening on IDEMD_ADMIN_ADDR "+held.Addr().String()+": ")
	require.Contains(t, errOut, "address already in use")
	require.Contains(t, errOut, `IDEMD_LOG_LEVEL: "loud"`, "with the other problems")

	// The consumer role alone does not listen on IDEMD_HTTP_ADDR: held, it is no problem;
	// malformed, it still is.
	code, out, errOut = runIdemd(t, with("IDEMD_ROLES", "pruner", "IDEMD_HTTP_ADDR", held.Addr().String()), "check")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "serve would start")
	code, _, errOut = runIdemd(t, with("IDEMD_ROLES", "pruner", "IDEMD_HTTP_ADDR", "notanaddr"), "check")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "IDEMD_HTTP_ADDR notanaddr is not a listen address")

	// A pipelines file that does not exist is said so, with how to name another.
	code, _, errOut = runIdemd(t, with("IDEMD_PIPELINES_FILE", "/nonexistent/idemd.yaml"), "serve")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "the pipelines file /nonexistent/idemd.yaml was not found: write it, or name another with IDEMD_PIPELINES_FILE or -pipelines")
	require.NotContains(t, errOut, "not valid")
}

// TestCheckUnreachablePubSubBlamesOnlyPubSub: a Pub/Sub endpoint that does not answer (a
// closed port; a listener that accepts and never speaks) is reported as that, a warning per
// subscription, while the database and Kafka, which answer, are judged on their own answers:
// each dependency is reached within its own timeout (shortened here), all at once, not
// within one that the Pub/Sub probes used up.
func TestCheckUnreachablePubSubBlamesOnlyPubSub(t *testing.T) {
	t.Parallel()
	brokers := strings.Join(kafkatest.Brokers(t), ",")
	silent, err := net.Listen("tcp", "127.0.0.1:0") // accepts (the kernel's backlog), never answers
	require.NoError(t, err)
	t.Cleanup(func() { _ = silent.Close() })
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closedAddr := closed.Addr().String()
	require.NoError(t, closed.Close())

	for name, endpoint := range map[string]string{"closed port": closedAddr, "silent listener": silent.Addr().String()} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			file := filepath.Join(t.TempDir(), "idemd.yaml")
			require.NoError(t, os.WriteFile(file, []byte("subscriptions:\n"+
				"  - name: gcp\n    pubsub: {subscription: "+pubsubtest.SubscriptionName("unreachable")+"}\n"+
				"  - name: gcp2\n    pubsub: {subscription: "+pubsubtest.SubscriptionName("unreachable2")+"}\n"+
				"  - name: ledger\n    topics: ["+kafkatest.Name(t, "check")+"]\n"), 0o600))
			var out, errOut strings.Builder
			c := &cli{env: map[string]string{
				"IDEMD_PIPELINES_FILE": file, "IDEMD_DATABASE_URL": pgtest.URL(), "IDEMD_DB_SCHEMA": testSchema(t),
				"IDEMD_ROLES": "consumer", "IDEMD_KAFKA_BROKERS": brokers, "IDEMD_KAFKA_CREATE_TOPICS": "true",
				"IDEMD_HTTP_ADDR": proctest.FreeAddr(t), "IDEMD_ADMIN_ADDR": proctest.FreeAddr(t),
				"PUBSUB_EMULATOR_HOST": endpoint,
			}, stdout: &out, stderr: &errOut, checkTimeout: 3 * time.Second}
			start := time.Now()
			code := c.check(nil)
			took := time.Since(start)
			t.Logf("check took %s:\n%s%s", took, out.String(), errOut.String())

			require.Equal(t, 0, code, "an unreachable Pub/Sub is a warning, and the rest answers:\n%s", errOut.String())
			require.Contains(t, out.String(), "the database answers")
			require.Contains(t, out.String(), "Kafka answers")
			require.NotContains(t, errOut.String(), "database")
			require.NotContains(t, errOut.String(), "Kafka")
			warnings := linesWith(errOut.String(), "warning: ")
			require.Len(t, warnings, 2, errOut.String())
			require.Contains(t, warnings[0], `subscription "gcp": Pub/Sub does not answer`)
			require.Contains(t, warnings[1], `subscription "gcp2": Pub/Sub does not answer`)
			require.Less(t, took, 2*3*time.Second, "each subscription within its own timeout, all at once: not their sum")
		})
	}
}

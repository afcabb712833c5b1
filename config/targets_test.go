package config

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/delivery"
	"github.com/idemd/idemd/pipeline"
)

// routing is SPEC 2.3b's example file.
const routing = `sources:
  - name: billing
    verify: {scheme: stripe, secrets_env: [STRIPE_WEBHOOK_SECRET]}
    message_id: [{json: /data/object/id}, {json: /type}]
    order: {entity: {json: /data/object/id}, version: {json: /created}}
    publish:
      - {name: all, topic: billing.events, key: {json: /data/object/id}}
      - name: invoices
        http: {url: "https://erp.example/hooks", secret_env: ERP_SECRET, rate: 50, breaker: {failures: 5, cool_down: 30s}}
        filter: {type: ["invoice.*"]}
      - http: {url: "https://audit.example/in", secret_env: ERP_SECRET, retry: {max_attempts: 3, min_backoff: 1s, max_backoff: 1m, max_age: 2h}}
        filter: {json: /data/object/currency, in: [eur]}
  - name: payments
    path: /v1/payments
    verify: {scheme: bearer, tokens_env: ORDERS_TOKENS}
    idempotency: {required: true, lookup: true}
    effect: {sql: "SELECT * FROM charge(@tenant, @payload)", status: 201}
    delete: {sql: "DELETE FROM payment_methods WHERE tenant = @tenant AND id = @message_id"}
`

func routingLookup(name string) (string, bool) {
	if name == "ERP_SECRET" {
		return "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", true
	}
	return lookup(name)
}

func TestLoadRouting(t *testing.T) {
	t.Parallel()
	f, err := Parse("r.yaml", []byte(routing), routingLookup)
	require.NoError(t, err)
	billing := f.Sources[0]
	require.Equal(t, &pipeline.Field{Parts: []pipeline.Field{{JSON: "/data/object/id"}, {JSON: "/type"}}}, billing.MessageID,
		"a list is a composite id")
	require.Equal(t, &pipeline.Order{Entity: pipeline.Field{JSON: "/data/object/id"}, Version: pipeline.Field{JSON: "/created"}}, billing.Order)
	require.Len(t, billing.Publish, 3)
	require.Equal(t, "all", billing.Publish[0].Name)
	require.Equal(t, []string{"invoice.*"}, billing.Publish[1].Filter.Type)
	require.Equal(t, &delivery.Breaker{Failures: 5, CoolDown: 30 * time.Second}, billing.Publish[1].HTTP.Breaker)
	require.Equal(t, delivery.RetryPolicy{MaxAttempts: 3, MinBackoff: time.Second, MaxBackoff: time.Minute, MaxAge: 2 * time.Hour}, billing.Publish[2].HTTP.Retry)

	eps := f.DeliveryEndpoints()
	require.Len(t, eps, 2)
	require.Equal(t, "billing:invoices", eps[0].Name)
	require.Equal(t, 50.0, eps[0].Rate)
	require.Equal(t, 5, eps[0].Breaker.Failures)
	require.Equal(t, "billing:2", eps[1].Name, "an unnamed target is named by its position")
	require.Equal(t, 3, eps[1].Retry.MaxAttempts)
	require.Equal(t, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", eps[1].Secret)
	require.Equal(t, []string{"billing.events"}, f.Topics())

	payments := f.Sources[1]
	require.True(t, payments.Idempotency.Lookup)
	require.Contains(t, payments.Delete.SQL, "DELETE FROM payment_methods")
}

// One target without a list keeps its endpoint named after the pipeline (as before fan-out).
func TestSingleTargetEndpointKeepsPipelineName(t *testing.T) {
	t.Parallel()
	f, err := Parse("x.yaml", []byte(`sources:
  - name: stripe
    verify: {scheme: stripe, secrets_env: STRIPE_WEBHOOK_SECRET}
    publish: {topic: t, http: {url: "https://x.example", secret_env: ERP_SECRET}}
`), routingLookup)
	require.NoError(t, err)
	eps := f.DeliveryEndpoints()
	require.Len(t, eps, 1)
	require.Equal(t, "stripe", eps[0].Name)
}

func TestErrorsRouting(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, from, to string
		line           int
		field, msg     string
	}{
		{"unknown key in a list's target", "{name: all, topic: billing.events,", "{name: all, topik: billing.events,", 7, "publish[0].topik", "unknown key"},
		{"duplicate target names", "name: invoices", "name: all", 8, "publish[1].name", `name "all" is also the name of publish[0]`},
		{"bad target name", "name: invoices", "name: in/voices", 8, "publish[1].name", "not a valid name"},
		{"bad glob", `type: ["invoice.*"]`, `type: ["invoice.[*"]`, 10, "publish[1].filter.type[0]", "is not a glob"},
		{"filter without in", "in: [eur]", "in: []", 12, "publish[2].filter.in", "required with json or header"},
		{"empty filter", `filter: {type: ["invoice.*"]}`, `filter: {}`, 10, "publish[1].filter", "want type"},
		{"bad rate", "rate: 50", "rate: -1", 9, "publish[1].http.rate", "must be positive"},
		{"bad breaker", "failures: 5", "failures: 0", 9, "publish[1].http.breaker.failures", "at least 1"},
		{"bad backoff", "max_backoff: 1m", "max_backoff: 1ms", 11, "publish[2].http.retry.max_backoff", "below min_backoff"},
		{"bad composite part", "[{json: /data/object/id}, {json: /type}]", "[{json: /data/object/id}, {json: type}]", 4, "message_id[1].json", "pointer"},
		{"composite part unknown key", "[{json: /data/object/id}, {json: /type}]", "[{json: /data/object/id}, {jsn: /type}]", 4, "message_id[1].jsn", "unknown key"},
		{"order on an API source", "    idempotency: {required: true, lookup: true}\n", "    idempotency: {required: true, lookup: true}\n    order: {entity: {json: /a}, version: {json: /b}}\n", 17, "order", "for webhook sources"},
		{"delete on a webhook source", "    order: {entity", "    delete: {sql: \"DELETE FROM x\"}\n    order: {entity", 5, "delete", "API sources only"},
		{"delete with an unknown parameter", "id = @message_id", "id = @id", 18, "delete.sql", "unknown parameter @id"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			require.Contains(t, routing, c.from)
			_, err := Parse("r.yaml", []byte(strings.Replace(routing, c.from, c.to, 1)), routingLookup)
			require.Error(t, err)
			label := `sources[0] "billing"`
			if c.line > 12 {
				label = `sources[1] "payments"`
			}
			requireNames(t, err, "r.yaml", c.line, label, c.field, c.msg)
		})
	}
}

// A single target's fields are named as the file writes them, without an index; a type
// filter on a scheme without event types is refused.
func TestErrorsSingleTarget(t *testing.T) {
	t.Parallel()
	_, err := Parse("x.yaml", []byte(`sources:
  - name: h
    verify: {scheme: hmac-sha256, secrets_env: STRIPE_WEBHOOK_SECRET, header: X-Sig}
    message_id: {json: /id}
    publish: {topic: t, tpoic: u, filter: {type: [a.*]}}
`), routingLookup)
	require.Error(t, err)
	requireNames(t, err, "x.yaml", 5, `sources[0] "h"`, "publish.tpoic", "unknown key")
	requireNames(t, err, "x.yaml", 5, `sources[0] "h"`, "publish.filter.type", "scheme hmac-sha256 carries no event type")
}

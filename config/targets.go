package config

import (
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/idemd/idemd/delivery"
	"github.com/idemd/idemd/pipeline"
	"github.com/idemd/idemd/receiver"
)

// typedSchemes are the schemes whose webhooks carry an event type (receiver: Stripe and
// Standard Webhooks /type, GitHub X-GitHub-Event, Shopify X-Shopify-Topic, Slack
// /event/type), which filter.type matches.
var typedSchemes = []string{"stripe", "standard-webhooks", "github", "shopify", "slack"}

// targets checks a pipeline's publish targets. scheme is a source's verification scheme, ""
// for a subscription (whose event type is the record's event-type header); broker says the
// subscription is a Pub/Sub or SQS one, whose keys read attributes, not headers. A single
// target (publish: {topic: …}) is named "publish", a list's targets "publish[i]", as the
// file writes them.
func (p *parser) targets(w *where, ts pipeline.Targets, effectSQL, scheme string, broker bool) {
	names := map[string]string{}
	for i := range ts {
		field := targetField(w, len(ts), i)
		p.target(w, field, &ts[i], effectSQL, scheme, broker)
		name := ts.Name(i)
		if other, ok := names[name]; ok {
			p.errf(w, field+".name", "name %q is also the name of %s (unnamed targets are named by their position): names derive operation ids and must be unique", name, other)
		}
		names[name] = field
	}
}

// targetField is how the file names target i of n: "publish" when publish is one mapping,
// "publish[i]" in a list.
func targetField(w *where, n, i int) string {
	if n > 1 || (w != nil && w.set("publish[0]")) {
		return fmt.Sprintf("publish[%d]", i)
	}
	return "publish"
}

func (p *parser) target(w *where, field string, t *pipeline.Publish, effectSQL, scheme string, broker bool) {
	sub := scheme == ""
	if t.Name != "" && !pipeline.ValidName(t.Name) {
		p.errf(w, field+".name", "%q is not a valid name: letters, digits, '.', '_' and '-', at most 100", t.Name)
	}
	if err := t.ValidateDestination(); err != nil {
		p.subErr(w, field, err)
	}
	switch {
	case t.Key != nil && broker:
		p.brokerField(w, field+".key", t.Key)
	case t.Key != nil:
		p.field(w, field+".key", t.Key, sub)
	}
	switch t.Body {
	case "", pipeline.BodyPayload:
	case pipeline.BodyEffect:
		if sub {
			p.errf(w, field+".body", "subscriptions publish the consumed payload; body effect is for sources")
		} else if effectSQL == "" {
			p.errf(w, field+".body", "body effect publishes the rows effect.sql returns: set effect.sql")
		}
	default:
		p.errf(w, field+".body", "unknown body %q (known: payload, effect)", t.Body)
	}
	if f := t.Filter; f != nil {
		p.filter(w, field+".filter", f, scheme)
	}
	if h := t.HTTP; h != nil {
		p.http(w, field+".http", h)
	}
}

func (p *parser) filter(w *where, field string, f *pipeline.Filter, scheme string) {
	if len(f.Type) > 0 && scheme != "" && !slices.Contains(typedSchemes, scheme) {
		p.errf(w, field+".type", "scheme %s carries no event type (stripe, standard-webhooks, github, shopify and slack do): filter on a value with json and in instead", scheme)
	}
	if err := f.Validate(scheme == ""); err != nil {
		p.subErr(w, field, err)
	}
}

// subErr reports err about field, or about its sub-field when err starts with one
// ("type[1]: …", "in: …", "sqs.queue: …").
func (p *parser) subErr(w *where, field string, err error) {
	if sub, msg, ok := strings.Cut(err.Error(), ": "); ok && !strings.ContainsAny(sub, " ,") {
		p.errf(w, field+"."+sub, "%s", msg)
		return
	}
	p.errf(w, field, "%v", err)
}

func (p *parser) http(w *where, field string, h *pipeline.HTTP) {
	if u, err := url.Parse(h.URL); h.URL == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		p.errf(w, field+".url", "want an http:// or https:// URL")
	}
	if h.SecretEnv == "" {
		p.errf(w, field+".secret_env", "required: name the environment variable holding the signing secret")
	} else if secret, ok := p.secret(w, field+".secret_env", h.SecretEnv); ok {
		if _, err := delivery.ParseSecret(secret); err != nil {
			p.errf(w, field+".secret_env", "environment variable %s: %v", h.SecretEnv, err)
		}
		h.Secret = secret
	}
	if h.Rate < 0 || (w.set(field+".rate") && h.Rate == 0) {
		p.errf(w, field+".rate", "must be positive: requests per second (omit it for no cap)")
	}
	if b := h.Breaker; b != nil && (b.Failures < 0 || (w.set(field+".breaker.failures") && b.Failures == 0)) {
		p.errf(w, field+".breaker.failures", "must be at least 1")
	}
	r := h.Retry
	if r.MaxAttempts < 0 || (w.set(field+".retry.max_attempts") && r.MaxAttempts == 0) {
		p.errf(w, field+".retry.max_attempts", "must be at least 1")
	}
	if r.MaxBackoff != 0 && r.MaxBackoff < r.MinBackoff {
		p.errf(w, field+".retry.max_backoff", "%s is below min_backoff (%s)", r.MaxBackoff, r.MinBackoff)
	}
}

// order checks a stale-event guard.
func (p *parser) order(w *where, o *pipeline.Order, keyAllowed bool) {
	if o == nil {
		return
	}
	p.field(w, "order.entity", &o.Entity, keyAllowed)
	p.field(w, "order.version", &o.Version, keyAllowed)
}

// api checks what an API source serves beside POST and PUT, and the stale guard, which is
// for webhook sources.
func (p *parser) api(w *where, s *receiver.Source) {
	if s.Order != nil {
		if s.Idempotency != nil {
			p.errf(w, "order", "the stale-event guard is for webhook sources (an API request is answered with its own result)")
		} else {
			p.order(w, s.Order, false)
		}
	}
	if s.Delete != nil {
		if s.Idempotency == nil {
			p.errf(w, "delete", "DELETE {path}/{id} is served by API sources only: set idempotency")
		}
		p.sql(w, "delete.sql", s.Delete.SQL)
	}
}

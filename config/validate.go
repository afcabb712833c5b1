package config

import (
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"github.com/idemd/idemd/consumer"
	"github.com/idemd/idemd/pipeline"
	"github.com/idemd/idemd/receiver"
)

var (
	validName     = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._-]{0,99}$`)
	validHeader   = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
	namedArgument = regexp.MustCompile(`(^|[^a-zA-Z0-9_@])@([a-zA-Z_][a-zA-Z0-9_]*)`)
	quoted        = regexp.MustCompile(`'(?:[^']|'')*'`)
)

// signatureSchemes verify an HMAC with secrets named by secrets_env.
var signatureSchemes = []string{"stripe", "standard-webhooks", "github", "shopify", "slack", "hmac-sha256"}

// timestampSchemes sign a timestamp, checked against tolerance.
var timestampSchemes = []string{"stripe", "standard-webhooks", "slack"}

func (p *parser) name(w *where, name string, names map[string]string) {
	switch {
	case name == "":
		p.errf(w, "name", "required")
	case !validName.MatchString(name):
		p.errf(w, "name", "%q is not a valid name: letters, digits, '.', '_' and '-', at most 100", name)
	case names[name] != "":
		p.errf(w, "name", "duplicate name %q: also %s (names scope message ids and must be unique)", name, names[name])
	default:
		names[name] = w.label
	}
}

// set reports whether the file gives field (a key present, whatever its value).
func (w *where) set(field string) bool {
	_, ok := w.lines[field]
	return ok
}

func (p *parser) source(w *where, s *receiver.Source, names, paths map[string]string) {
	p.name(w, s.Name, names)
	path := s.RoutePath()
	switch {
	case s.Name == "" && s.Path == "":
	case !strings.HasPrefix(path, "/") || strings.ContainsAny(path, " ?#"):
		p.errf(w, "path", "%q is not a URL path: want /something without query", path)
	case paths[path] != "":
		p.errf(w, "path", "duplicate path %q: also %s", path, paths[path])
	default:
		paths[path] = w.label
	}

	p.verify(w, s)
	if s.MessageID != nil {
		p.field(w, "message_id", s.MessageID, false)
	}
	if s.Idempotency != nil && w.set("retention") {
		p.errf(w, "retention", "API sources keep keys for idempotency.retention; remove retention")
	}
	if w.set("effect") {
		p.effect(w, s.Effect.SQL)
	}
	switch {
	case !w.set("effect.status"):
	case s.Idempotency == nil:
		p.errf(w, "effect.status", "only API sources (with idempotency:) answer with the effect's status")
	case s.Effect.Status < 200 || s.Effect.Status > 299:
		p.errf(w, "effect.status", "%d is not a 2xx status", s.Effect.Status)
	}
	if s.Publish != nil {
		p.publish(w, s.Publish, s.Effect.SQL, false)
	}
	if s.BodyLimit < 0 {
		p.errf(w, "max_body_bytes", "must be positive")
	}
	if s.MaxAttempts < 0 {
		p.errf(w, "max_attempts", "must be at least 1")
	}
	for i, ptr := range s.FingerprintIgnore {
		if !strings.HasPrefix(ptr, "/") {
			p.errf(w, fmt.Sprintf("fingerprint_ignore[%d]", i), "%q is not a JSON pointer: want /path/to/field", ptr)
		}
	}
}

func (p *parser) verify(w *where, s *receiver.Source) {
	v := &s.Verify
	switch {
	case v.Scheme == "":
		p.errf(w, "verify.scheme", "required (one of %s)", strings.Join(Schemes, ", "))
		return
	case !slices.Contains(Schemes, v.Scheme):
		p.errf(w, "verify.scheme", "unknown scheme %q (known: %s)", v.Scheme, strings.Join(Schemes, ", "))
		return
	}
	if slices.Contains(signatureSchemes, v.Scheme) {
		if len(v.SecretsEnv) == 0 {
			p.errf(w, "verify.secrets_env", "required for scheme %s: name the environment variable(s) holding the secret", v.Scheme)
		}
		for i, name := range v.SecretsEnv {
			field := fmt.Sprintf("verify.secrets_env[%d]", i)
			if secret, ok := p.secret(w, field, name); ok {
				v.Secrets = append(v.Secrets, secret)
			}
		}
	} else if len(v.SecretsEnv) > 0 {
		p.errf(w, "verify.secrets_env", "not used by scheme %s", v.Scheme)
	}

	if v.Scheme == "bearer" {
		if v.TokensEnv == "" {
			p.errf(w, "verify.tokens_env", "required for scheme bearer: name the environment variable holding token=tenant,token2=tenant2")
		} else if raw, ok := p.secret(w, "verify.tokens_env", v.TokensEnv); ok {
			tokens, err := receiver.ParseTokens(raw)
			if err != nil {
				p.errf(w, "verify.tokens_env", "environment variable %s: %v", v.TokensEnv, err)
			}
			v.Tokens = tokens
		}
		if s.Idempotency == nil {
			p.errf(w, "verify.scheme", "bearer is for API sources: set idempotency")
		}
	} else if v.TokensEnv != "" {
		p.errf(w, "verify.tokens_env", "not used by scheme %s", v.Scheme)
	}

	if v.Scheme == "hmac-sha256" {
		if v.Header == "" {
			p.errf(w, "verify.header", "required for scheme hmac-sha256")
		} else if !validHeader.MatchString(v.Header) {
			p.errf(w, "verify.header", "%q is not a header name", v.Header)
		}
		switch v.Encoding {
		case "", "hex", "base64":
		default:
			p.errf(w, "verify.encoding", "unknown encoding %q (known: hex, base64)", v.Encoding)
		}
	} else {
		for _, f := range []string{"verify.header", "verify.encoding", "verify.prefix"} {
			if w.set(f) {
				p.errf(w, f, "only scheme hmac-sha256 takes a %s", strings.TrimPrefix(f, "verify."))
			}
		}
	}

	if w.set("verify.tolerance") && !slices.Contains(timestampSchemes, v.Scheme) {
		p.errf(w, "verify.tolerance", "scheme %s signs no timestamp", v.Scheme)
	}

	if v.Scheme == "none" && !s.AllowUnverified {
		p.errf(w, "verify.scheme", "scheme none accepts anyone's requests: set allow_unverified: true to mean it")
	}
	if (v.Scheme == "none" || v.Scheme == "hmac-sha256") && s.MessageID == nil && s.Idempotency == nil {
		p.errf(w, "message_id", "required for scheme %s (no default message id)", v.Scheme)
	}
}

// secret resolves an environment variable named by the file. Its value never appears in a
// message.
func (p *parser) secret(w *where, field, name string) (string, bool) {
	if name == "" {
		p.errf(w, field, "empty environment variable name")
		return "", false
	}
	v, ok := p.lookup(name)
	if !ok || v == "" {
		p.errf(w, field, "environment variable %s is not set (the file names secrets; their values live in the environment)", name)
		return "", false
	}
	return v, true
}

// field checks a pipeline.Field, naming the sub-field at fault.
func (p *parser) field(w *where, name string, f *pipeline.Field, keyAllowed bool) {
	if f.Header != "" && !validHeader.MatchString(f.Header) {
		p.errf(w, name+".header", "%q is not a header name", f.Header)
	}
	if err := f.Validate(keyAllowed); err != nil {
		sub, msg, ok := strings.Cut(err.Error(), ": ")
		if ok && (sub == "json" || sub == "key") {
			p.errf(w, name+"."+sub, "%s", msg)
			return
		}
		p.errf(w, name, "%v", err)
	}
}

func (p *parser) effect(w *where, sql string) {
	if strings.TrimSpace(sql) == "" {
		p.errf(w, "effect.sql", "required")
	}
	for _, name := range sqlParameters(sql) {
		if !slices.Contains(SQLParameters, name) {
			p.errf(w, "effect.sql", "unknown parameter @%s (known: @%s)", name, strings.Join(SQLParameters, ", @"))
		}
	}
}

// sqlParameters lists the pgx named arguments of sql, outside string literals.
func sqlParameters(sql string) []string {
	var out []string
	for _, m := range namedArgument.FindAllStringSubmatch(quoted.ReplaceAllString(sql, "''"), -1) {
		if !slices.Contains(out, m[2]) {
			out = append(out, m[2])
		}
	}
	return out
}

func (p *parser) publish(w *where, pub *pipeline.Publish, effectSQL string, keyAllowed bool) {
	if pub.Topic == "" && pub.HTTP == nil {
		p.errf(w, "publish", "want topic, http or both")
	}
	if pub.Key != nil {
		p.field(w, "publish.key", pub.Key, keyAllowed)
	}
	switch pub.Body {
	case "", pipeline.BodyPayload:
	case pipeline.BodyEffect:
		if keyAllowed {
			p.errf(w, "publish.body", "subscriptions publish the consumed payload; body effect is for sources")
		} else if effectSQL == "" {
			p.errf(w, "publish.body", "body effect publishes the rows effect.sql returns: set effect.sql")
		}
	default:
		p.errf(w, "publish.body", "unknown body %q (known: payload, effect)", pub.Body)
	}
	if h := pub.HTTP; h != nil {
		if u, err := url.Parse(h.URL); h.URL == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			p.errf(w, "publish.http.url", "want an http:// or https:// URL")
		}
		if h.SecretEnv == "" {
			p.errf(w, "publish.http.secret_env", "required: name the environment variable holding the signing secret")
		} else if secret, ok := p.secret(w, "publish.http.secret_env", h.SecretEnv); ok {
			h.Secret = secret
		}
	}
}

func (p *parser) subscription(w *where, s *consumer.Config, names map[string]string) {
	p.name(w, s.Name, names)
	if len(s.Topics) == 0 {
		p.errf(w, "topics", "required: at least one topic")
	}
	for i, t := range s.Topics {
		if t == "" {
			p.errf(w, fmt.Sprintf("topics[%d]", i), "empty topic")
		}
	}
	if s.MessageID != nil {
		p.field(w, "message_id", s.MessageID, true)
	}
	if s.Order != nil {
		p.field(w, "order.entity", &s.Order.Entity, true)
		p.field(w, "order.version", &s.Order.Version, true)
	}
	if w.set("effect") {
		p.effect(w, s.Effect.SQL)
	}
	if s.Publish != nil {
		p.publish(w, s.Publish, s.Effect.SQL, true)
	}
	if s.DeadLetter.MaxAttempts < 0 || (w.set("dead_letter.max_attempts") && s.DeadLetter.MaxAttempts == 0) {
		p.errf(w, "dead_letter.max_attempts", "must be at least 1")
	}
}

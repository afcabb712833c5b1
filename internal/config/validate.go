package config

import (
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/idemd/idemd/delivery"
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

func (p *parser) source(s *Source, names, paths map[string]string) {
	w := s.loc
	p.name(w, s.Name, names)
	if s.Path == "" && s.Name != "" {
		s.Path = "/webhooks/" + s.Name
	}
	switch {
	case s.Path == "":
	case !strings.HasPrefix(s.Path, "/") || strings.ContainsAny(s.Path, " ?#"):
		p.errf(w, "path", "%q is not a URL path: want /something without query", s.Path)
	case paths[s.Path] != "":
		p.errf(w, "path", "duplicate path %q: also %s", s.Path, paths[s.Path])
	default:
		paths[s.Path] = w.label
	}

	p.verify(w, s)
	if s.MessageID != nil {
		p.extractor(w, "message_id", s.MessageID, false)
	}
	if s.Idempotency != nil {
		s.Idempotency.Retention.Duration = p.duration(w, "idempotency.retention", s.Idempotency.Retention, IdempotencyRetentionDefault)
		if s.Retention.raw != "" {
			p.errf(w, "retention", "API sources keep keys for idempotency.retention; remove retention")
		}
		s.Retention.Duration = s.Idempotency.Retention.Duration
	} else {
		s.Retention.Duration = p.duration(w, "retention", s.Retention, RetentionDefault)
	}
	if s.Effect != nil {
		p.effect(w, s.Effect, s.Idempotency != nil)
	}
	if s.Publish != nil {
		p.publish(w, s.Publish, s.Effect, false)
	}
	if s.MaxBodyBytes == 0 {
		s.MaxBodyBytes = MaxBodyBytesDefault
	} else if s.MaxBodyBytes < 0 {
		p.errf(w, "max_body_bytes", "must be positive")
	}
}

func (p *parser) verify(w *where, s *Source) {
	v := &s.Verify
	if v.SecretsEnv.err != nil {
		p.errf(w, "verify.secrets_env", "%v", v.SecretsEnv.err)
	}
	switch {
	case v.Scheme == "":
		p.errf(w, "verify.scheme", "required (one of %s)", strings.Join(Schemes, ", "))
		return
	case !slices.Contains(Schemes, v.Scheme):
		p.errf(w, "verify.scheme", "unknown scheme %q (known: %s)", v.Scheme, strings.Join(Schemes, ", "))
		return
	}
	signed := slices.Contains(signatureSchemes, v.Scheme)
	if signed {
		if len(v.SecretsEnv.Values) == 0 {
			p.errf(w, "verify.secrets_env", "required for scheme %s: name the environment variable(s) holding the secret", v.Scheme)
		}
		for i, name := range v.SecretsEnv.Values {
			field := fmt.Sprintf("verify.secrets_env[%d]", i)
			if secret, ok := p.secret(w, field, name); ok {
				if err := receiver.CheckSecret(v.Scheme, secret); err != nil {
					p.errf(w, field, "environment variable %s: %v", name, err)
				}
				v.Secrets = append(v.Secrets, secret)
			}
		}
	} else if len(v.SecretsEnv.Values) > 0 {
		p.errf(w, "verify.secrets_env", "not used by scheme %s", v.Scheme)
	}

	if v.Scheme == "bearer" {
		if v.TokensEnv == "" {
			p.errf(w, "verify.tokens_env", "required for scheme bearer: name the environment variable holding token=tenant,token2=tenant2")
		} else if raw, ok := p.secret(w, "verify.tokens_env", v.TokensEnv); ok {
			tokens, err := parseTokens(raw)
			if err != nil {
				p.errf(w, "verify.tokens_env", "environment variable %s: %v", v.TokensEnv, err)
			}
			for _, tok := range slices.Sorted(maps.Keys(tokens)) {
				if err := receiver.CheckSecret(v.Scheme, tok); err != nil {
					p.errf(w, "verify.tokens_env", "environment variable %s: the token of tenant %q: %v", v.TokensEnv, tokens[tok], err)
				}
			}
			v.Tokens = tokens
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
		case "":
			v.Encoding = "hex"
		case "hex", "base64":
		default:
			p.errf(w, "verify.encoding", "unknown encoding %q (known: hex, base64)", v.Encoding)
		}
	} else {
		if v.Header != "" {
			p.errf(w, "verify.header", "only scheme hmac-sha256 takes a header")
		}
		if v.Encoding != "" {
			p.errf(w, "verify.encoding", "only scheme hmac-sha256 takes an encoding")
		}
	}

	if slices.Contains(timestampSchemes, v.Scheme) {
		v.Tolerance.Duration = p.duration(w, "verify.tolerance", v.Tolerance, ToleranceDefault)
	} else if v.Tolerance.raw != "" {
		p.errf(w, "verify.tolerance", "scheme %s signs no timestamp", v.Scheme)
	}

	if v.Scheme == "none" && !s.AllowUnverified {
		p.errf(w, "verify.scheme", "scheme none accepts anyone's requests: set allow_unverified: true to mean it")
	}
	if (v.Scheme == "none" || v.Scheme == "hmac-sha256") && s.MessageID == nil {
		p.errf(w, "message_id", "required for scheme %s (no default message id)", v.Scheme)
	}
	headerID := v.Scheme == "hmac-sha256" && s.MessageID != nil && s.MessageID.Header != ""
	switch {
	case headerID && !s.AllowUnsignedMessageID:
		p.errf(w, "message_id.header", "%v", receiver.ErrUnsignedMessageID)
	case !headerID && s.AllowUnsignedMessageID:
		p.errf(w, "allow_unsigned_message_id", "%v", receiver.ErrUnsignedMessageIDUnused)
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

func parseTokens(raw string) (map[string]string, error) {
	tokens := map[string]string{}
	for i, pair := range strings.Split(raw, ",") {
		token, tenant, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok || token == "" || tenant == "" {
			return nil, fmt.Errorf("entry %d is not token=tenant (want token=tenant,token2=tenant2)", i+1)
		}
		if _, dup := tokens[token]; dup {
			return nil, fmt.Errorf("entry %d repeats a token", i+1)
		}
		tokens[token] = tenant
	}
	return tokens, nil
}

func (p *parser) extractor(w *where, field string, e *Extractor, keyAllowed bool) {
	set := 0
	if e.JSON != "" {
		set++
		if !strings.HasPrefix(e.JSON, "/") {
			p.errf(w, field+".json", "%q is not a JSON pointer: want /path/to/field", e.JSON)
		}
	}
	if e.Header != "" {
		set++
		if !validHeader.MatchString(e.Header) {
			p.errf(w, field+".header", "%q is not a header name", e.Header)
		}
	}
	if e.Key {
		set++
		if !keyAllowed {
			p.errf(w, field+".key", "only subscriptions have a record key")
		}
	}
	if set != 1 {
		p.errf(w, field, "want exactly one of json, header%s", map[bool]string{true: ", key", false: ""}[keyAllowed])
	}
}

func (p *parser) duration(w *where, field string, d Duration, def time.Duration) time.Duration {
	switch {
	case d.err != nil:
		p.errf(w, field, "%v", d.err)
		return def
	case d.raw == "":
		return def
	case d.Duration <= 0:
		p.errf(w, field, "must be positive")
		return def
	}
	return d.Duration
}

func (p *parser) effect(w *where, e *Effect, api bool) {
	if strings.TrimSpace(e.SQL) == "" {
		p.errf(w, "effect.sql", "required")
	}
	for _, name := range sqlParameters(e.SQL) {
		if !slices.Contains(SQLParameters, name) {
			p.errf(w, "effect.sql", "unknown parameter @%s (known: @%s)", name, strings.Join(SQLParameters, ", @"))
		}
	}
	switch {
	case e.Status == 0:
		e.Status = 200
	case !api:
		p.errf(w, "effect.status", "only API sources (with idempotency:) answer with the effect's status")
	case e.Status < 200 || e.Status > 299:
		p.errf(w, "effect.status", "%d is not a 2xx status", e.Status)
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

func (p *parser) publish(w *where, pub *Publish, eff *Effect, keyAllowed bool) {
	if pub.Topic == "" && pub.HTTP == nil {
		p.errf(w, "publish", "want topic, http or both")
	}
	if pub.Key != nil {
		p.extractor(w, "publish.key", pub.Key, keyAllowed)
	}
	switch pub.Body {
	case "":
		pub.Body = "payload"
	case "payload":
	case "effect":
		if eff == nil || eff.SQL == "" {
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
			if _, err := delivery.ParseSecret(secret); err != nil {
				p.errf(w, "publish.http.secret_env", "environment variable %s: %v", h.SecretEnv, err)
			}
			h.Secret = secret
		}
		h.Timeout.Duration = p.duration(w, "publish.http.timeout", h.Timeout, HTTPTimeoutDefault)
	}
}

func (p *parser) subscription(s *Subscription, names map[string]string) {
	w := s.loc
	p.name(w, s.Name, names)
	if len(s.Topics) == 0 {
		p.errf(w, "topics", "required: at least one topic")
	}
	for i, t := range s.Topics {
		if t == "" {
			p.errf(w, fmt.Sprintf("topics[%d]", i), "empty topic")
		}
	}
	if s.Group == "" && s.Name != "" {
		s.Group = "idemd-" + s.Name
	}
	if s.MessageID != nil {
		p.extractor(w, "message_id", s.MessageID, true)
	}
	if s.Order != nil {
		p.extractor(w, "order.entity", &s.Order.Entity, true)
		p.extractor(w, "order.version", &s.Order.Version, true)
	}
	if s.Effect != nil {
		p.effect(w, s.Effect, false)
	}
	if s.Publish != nil {
		p.publish(w, s.Publish, s.Effect, true)
	}
	if s.DeadLetter == nil {
		s.DeadLetter = &DeadLetter{}
	}
	switch {
	case s.DeadLetter.MaxAttempts == 0:
		s.DeadLetter.MaxAttempts = MaxAttemptsDefault
	case s.DeadLetter.MaxAttempts < 0:
		p.errf(w, "dead_letter.max_attempts", "must be at least 1")
	}
	s.Retention.Duration = p.duration(w, "retention", s.Retention, RetentionDefault)
}

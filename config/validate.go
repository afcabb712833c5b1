package config

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/idemd/idemd/consumer"
	"github.com/idemd/idemd/outbox"
	"github.com/idemd/idemd/pipeline"
	"github.com/idemd/idemd/receiver"
)

var (
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
	case !pipeline.ValidName(name):
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
	p.targets(w, s.Publish, s.Effect.SQL, s.Verify.Scheme, false)
	p.api(w, s)
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
				if err := receiver.CheckSecret(v.Scheme, secret); err != nil {
					p.errf(w, field, "environment variable %s: %v", name, err)
				}
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
			for _, tok := range slices.Sorted(maps.Keys(tokens)) {
				if err := receiver.CheckSecret(v.Scheme, tok); err != nil {
					p.errf(w, "verify.tokens_env", "environment variable %s: the token of tenant %q: %v", v.TokensEnv, tokens[tok], err)
				}
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
	headerID := v.Scheme == "hmac-sha256" && s.MessageID != nil && s.MessageID.UsesHeader()
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

// field checks a pipeline.Field, naming the sub-field at fault; the parts of a composite
// are named as the file lists them (message_id[1].json).
func (p *parser) field(w *where, name string, f *pipeline.Field, keyAllowed bool) {
	p.fieldWith(w, name, f, func(f *pipeline.Field) error { return f.Validate(keyAllowed) })
}

// brokerField is field for a Pub/Sub or SQS subscription: attributes, no headers.
func (p *parser) brokerField(w *where, name string, f *pipeline.Field) {
	p.fieldWith(w, name, f, (*pipeline.Field).ValidateBroker)
}

// fieldWith is field, with the door's validation of a plain field.
func (p *parser) fieldWith(w *where, name string, f *pipeline.Field, validate func(*pipeline.Field) error) {
	if len(f.Parts) > 0 {
		if f.JSON != "" || f.Header != "" || f.Attribute != "" || f.Key {
			p.errf(w, name, "a composite lists its parts only: want a list of {json: …} or {header: …}")
		}
		for i := range f.Parts {
			part := fmt.Sprintf("%s[%d]", name, i)
			if len(f.Parts[i].Parts) > 0 {
				p.errf(w, part, "a part is one json pointer or header, not a list")
				continue
			}
			p.fieldWith(w, part, &f.Parts[i], validate)
		}
		return
	}
	if f.Header != "" && !validHeader.MatchString(f.Header) {
		p.errf(w, name+".header", "%q is not a header name", f.Header)
	}
	if err := validate(f); err != nil {
		sub, msg, ok := strings.Cut(err.Error(), ": ")
		if ok && (sub == "json" || sub == "key" || sub == "header" || sub == "attribute") {
			p.errf(w, name+"."+sub, "%s", msg)
			return
		}
		p.errf(w, name, "%v", err)
	}
}

func (p *parser) effect(w *where, sql string) { p.sql(w, "effect.sql", sql) }

// sql checks the SQL of field (effect.sql, delete.sql): present, known parameters only.
func (p *parser) sql(w *where, field, sql string) {
	if strings.TrimSpace(sql) == "" {
		p.errf(w, field, "required")
	}
	for _, name := range sqlParameters(sql) {
		if !slices.Contains(SQLParameters, name) {
			p.errf(w, field, "unknown parameter @%s (known: @%s)", name, strings.Join(SQLParameters, ", @"))
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

func (p *parser) subscription(w *where, s *consumer.Config, names map[string]string) {
	p.name(w, s.Name, names)
	door := p.subscriptionSource(w, s)
	if door == consumer.DoorKafka {
		if s.MessageID != nil {
			p.field(w, "message_id", s.MessageID, true)
		}
		p.order(w, s.Order, true)
	} else {
		if s.MessageID != nil {
			p.brokerField(w, "message_id", s.MessageID)
		}
		if s.Order != nil {
			p.brokerField(w, "order.entity", &s.Order.Entity)
			p.brokerField(w, "order.version", &s.Order.Version)
		}
	}
	if w.set("effect") {
		p.effect(w, s.Effect.SQL)
	}
	p.targets(w, s.Publish, s.Effect.SQL, "", door != consumer.DoorKafka)
	if s.DeadLetter.MaxAttempts < 0 || (w.set("dead_letter.max_attempts") && s.DeadLetter.MaxAttempts == 0) {
		p.errf(w, "dead_letter.max_attempts", "must be at least 1")
	}
	if s.DeadLetter.Topic != "" {
		if err := outbox.CheckKafkaTopic(s.DeadLetter.Topic); err != nil {
			p.errf(w, "dead_letter.topic", "%v", err)
		}
	}
	switch {
	case s.BatchSize < 0 || (w.set("batch_size") && s.BatchSize == 0):
		p.errf(w, "batch_size", "must be at least 1")
	case s.BatchSize > BatchSizeMax:
		p.errf(w, "batch_size", "must be at most %d (a batch is one transaction, and each Kafka partition's reader queues as many records)", BatchSizeMax)
	}
	if s.BatchesInFlight < 0 || (w.set("batches_in_flight") && s.BatchesInFlight == 0) {
		p.errf(w, "batches_in_flight", "must be at least 1 (each batch in flight holds a database connection)")
	}
}

// BatchSizeMax is the largest batch_size a subscription may set: a batch is one
// transaction, and each Kafka partition's reader queues up to batch_size records.
const BatchSizeMax = 10000

// subscriptionSource checks the subscription's source — exactly one of topics (Kafka),
// pubsub and sqs — and returns its door.
// lease checks a broker subscription's lease and max_lease.
func (p *parser) lease(w *where, s *consumer.Config, door string) {
	for _, k := range []string{"lease", "max_lease"} {
		if door == consumer.DoorKafka && w.set(k) {
			p.errf(w, k, "only Pub/Sub and SQS subscriptions lease their messages (a Kafka partition is held by its consumer group)")
		}
	}
	switch {
	case door == consumer.DoorSQS && s.Lease%time.Second != 0:
		p.errf(w, "lease", "SQS visibility timeouts are whole seconds, got %s", s.Lease)
	case door == consumer.DoorPubSub && s.Lease != 0 && s.Lease < 6*time.Second:
		p.errf(w, "lease", "at least 6s (the Pub/Sub client extends a deadline 5 s after the stream opens), got %s", s.Lease)
	case s.MaxLease != 0 && s.MaxLease < s.Lease:
		p.errf(w, "max_lease", "shorter than lease (%s < %s)", s.MaxLease, s.Lease)
	}
}

func (p *parser) subscriptionSource(w *where, s *consumer.Config) string {
	var set []string
	for _, k := range []string{"topics", "pubsub", "sqs"} {
		if w.set(k) {
			set = append(set, k)
		}
	}
	switch {
	case len(set) == 0:
		p.errf(w, "topics", "required: name the source, topics: [TOPIC] (Kafka), pubsub: {subscription: ID} or sqs: {queue: NAME}")
		return consumer.DoorKafka
	case len(set) > 1:
		p.errf(w, set[1], "a subscription reads one source, and %s is given too: keep one of %s", set[0], strings.Join(set, ", "))
	}
	// "pubsub:" or "sqs:" without a value still names the door.
	if w.set("pubsub") && s.PubSub == nil {
		s.PubSub = &consumer.PubSub{}
	}
	if w.set("sqs") && s.SQS == nil {
		s.SQS = &consumer.SQS{}
	}
	door := s.Door()
	if door != consumer.DoorKafka && w.set("group") {
		p.errf(w, "group", "only Kafka subscriptions have a consumer group (a Pub/Sub subscription or an SQS queue is shared as it is)")
	}
	p.lease(w, s, door)
	switch door {
	case consumer.DoorKafka:
		if len(s.Topics) == 0 {
			p.errf(w, "topics", "required: at least one topic")
		}
		for i, t := range s.Topics {
			if t == "" {
				p.errf(w, fmt.Sprintf("topics[%d]", i), "empty topic")
			}
		}
	case consumer.DoorPubSub:
		if err := s.PubSub.Validate(); err != nil {
			sub, msg, _ := strings.Cut(err.Error(), ": ")
			p.errf(w, "pubsub."+sub, "%s", msg)
		}
	case consumer.DoorSQS:
		if s.SQS.Queue == "" {
			p.errf(w, "sqs.queue", "required: a queue name or a queue URL")
		}
	}
	return door
}

// Package config reads and validates the pipelines file (idemd.yaml): the HTTP sources and
// the Kafka subscriptions idemd runs. Guarantee: Load returns a File only when every problem
// of the file is absent; otherwise it returns all of them at once (errors.Join of *Error),
// each naming the file, the line, the pipeline and the field, so that an operator fixes the
// file in one pass. Secrets never live in the file: it names environment variables, which
// Load resolves through the lookup function the caller passes (only cmd/ reads the
// environment).
package config

import (
	"errors"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/idemd/idemd/internal/effectsql"
)

// Defaults of the pipelines file. They are documented in docs/daemon.md.
const (
	// RetentionDefault is how long webhook and subscription dedup records are kept: longer
	// than Stripe's and Svix's retry horizons (3 days, 27 h) with margin.
	RetentionDefault = 7 * 24 * time.Hour
	// IdempotencyRetentionDefault is how long API idempotency keys are kept.
	IdempotencyRetentionDefault = 24 * time.Hour
	// ToleranceDefault is the accepted clock skew of signed timestamps.
	ToleranceDefault = 5 * time.Minute
	// MaxBodyBytesDefault bounds request bodies.
	MaxBodyBytesDefault = 1 << 20
	// MaxAttemptsDefault is how many times a permanently failing effect runs before its
	// message is dead-lettered.
	MaxAttemptsDefault = 5
	// HTTPTimeoutDefault bounds one delivery of the outbound HTTP sink.
	HTTPTimeoutDefault = 10 * time.Second
)

// Schemes are the verification schemes of sources (SPEC 3.1).
var Schemes = []string{"stripe", "standard-webhooks", "github", "shopify", "slack", "hmac-sha256", "bearer", "none"}

// SQLParameters are the named parameters effect SQL may use (pgx named arguments).
var SQLParameters = effectsql.Params

// File is a parsed and validated pipelines file.
type File struct {
	// Path is where the file was read from ("" when parsed from memory).
	Path string `yaml:"-"`
	// Sources are the inbound HTTP pipelines.
	Sources []*Source `yaml:"sources"`
	// Subscriptions are the inbound Kafka pipelines.
	Subscriptions []*Subscription `yaml:"subscriptions"`
}

// Source is one inbound HTTP pipeline.
type Source struct {
	// Name scopes the ids of the source. Required, unique among all pipelines.
	Name string `yaml:"name"`
	// Path is the URL path requests are POSTed to. Defaults to /webhooks/{name}.
	Path string `yaml:"path"`
	// Verify says how requests are authenticated. Required.
	Verify Verify `yaml:"verify"`
	// AllowUnverified must be true for scheme none. Defaults to false.
	AllowUnverified bool `yaml:"allow_unverified"`
	// AllowUnsignedMessageID must be true for a message_id.header on scheme hmac-sha256,
	// whose signature does not cover headers (receiver.Source.AllowUnsignedMessageID).
	// Defaults to false.
	AllowUnsignedMessageID bool `yaml:"allow_unsigned_message_id"`
	// MessageID overrides the scheme's default message id (SPEC 3.1).
	MessageID *Extractor `yaml:"message_id"`
	// Idempotency, when set, makes the source an API with the Idempotency-Key contract.
	Idempotency *Idempotency `yaml:"idempotency"`
	// Effect is the SQL run in the dedup transaction. Optional.
	Effect *Effect `yaml:"effect"`
	// Publish writes an outbox event per new message. Optional.
	Publish *Publish `yaml:"publish"`
	// Retention is how long dedup records are kept. Defaults to 7 days (24 h for API
	// sources, see Idempotency.Retention).
	Retention Duration `yaml:"retention"`
	// MaxBodyBytes bounds the request body. Defaults to 1 MiB.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`

	loc *where `yaml:"-"`
}

// Verify is a source's authentication.
type Verify struct {
	// Scheme is one of Schemes. Required.
	Scheme string `yaml:"scheme"`
	// SecretsEnv names the environment variables holding the signing secrets; every one
	// is tried (rotation). Required for the signature schemes.
	SecretsEnv StringList `yaml:"secrets_env"`
	// TokensEnv names the environment variable holding "token=tenant,token2=tenant2".
	// Required for bearer.
	TokensEnv string `yaml:"tokens_env"`
	// Tolerance is the accepted age of signed timestamps. Defaults to 5m.
	Tolerance Duration `yaml:"tolerance"`
	// Header is the signature header of hmac-sha256. Required for hmac-sha256.
	Header string `yaml:"header"`
	// Encoding of the hmac-sha256 signature: hex or base64. Defaults to hex.
	Encoding string `yaml:"encoding"`

	// Secrets are the values of SecretsEnv, resolved by Load. Never logged.
	Secrets []string `yaml:"-"`
	// Tokens maps bearer tokens to tenants, resolved by Load from TokensEnv. Never logged.
	Tokens map[string]string `yaml:"-"`
}

// Extractor says where a value is found: one of a JSON pointer into the body, a header, or
// (subscriptions only) the record key.
type Extractor struct {
	// JSON is an RFC 6901 pointer into the JSON body, such as /data/object/id.
	JSON string `yaml:"json"`
	// Header is a header name.
	Header string `yaml:"header"`
	// Key takes the Kafka record key.
	Key bool `yaml:"key"`
}

// Idempotency is the Idempotency-Key contract of API sources.
type Idempotency struct {
	// Required rejects requests without a key (400). Defaults to false.
	Required bool `yaml:"required"`
	// Retention is how long keys and stored responses are kept. Defaults to 24h.
	Retention Duration `yaml:"retention"`
}

// Effect is SQL run in the dedup transaction, with pgx named arguments (SQLParameters).
type Effect struct {
	// SQL is the statement. Required when effect is given.
	SQL string `yaml:"sql"`
	// Status is the HTTP status of a new API request's answer. Defaults to 200.
	Status int `yaml:"status"`
}

// Publish writes an outbox event per new message.
type Publish struct {
	// Topic is the Kafka topic. Required unless HTTP is set.
	Topic string `yaml:"topic"`
	// Key is the record key. Defaults to none.
	Key *Extractor `yaml:"key"`
	// Body is "payload" (the inbound body) or "effect" (the rows the effect SQL returned,
	// as JSON). Defaults to payload.
	Body string `yaml:"body"`
	// HTTP delivers the event by POST as well as, or instead of, the topic.
	HTTP *HTTPSink `yaml:"http"`
}

// HTTPSink is the outbound HTTP delivery of an outbox event.
type HTTPSink struct {
	// URL receives the POST. Required.
	URL string `yaml:"url"`
	// SecretEnv names the environment variable with the Standard Webhooks secret. Required.
	SecretEnv string `yaml:"secret_env"`
	// Timeout bounds one delivery. Defaults to 10s.
	Timeout Duration `yaml:"timeout"`

	// Secret is the value of SecretEnv, resolved by Load. Never logged.
	Secret string `yaml:"-"`
}

// Subscription is one inbound Kafka pipeline.
type Subscription struct {
	// Name scopes the ids of the subscription. Required, unique among all pipelines.
	Name string `yaml:"name"`
	// Topics are consumed. Required.
	Topics []string `yaml:"topics"`
	// Group is the consumer group. Defaults to idemd-{name}.
	Group string `yaml:"group"`
	// MessageID says where the id is. Defaults to the first present of the headers
	// operation-id, message-id, idempotency-key.
	MessageID *Extractor `yaml:"message_id"`
	// Order is the optional stale-event guard.
	Order *Order `yaml:"order"`
	// Effect is the SQL run in the dedup transaction. Optional.
	Effect *Effect `yaml:"effect"`
	// Publish writes an outbox event per new message. Optional.
	Publish *Publish `yaml:"publish"`
	// DeadLetter configures dead-lettering. Defaults to max_attempts 5 and no topic.
	DeadLetter *DeadLetter `yaml:"dead_letter"`
	// Retention is how long dedup records are kept. Defaults to 7 days.
	Retention Duration `yaml:"retention"`

	loc *where `yaml:"-"`
}

// Order is the stale-event guard: a message whose version is not newer than the last
// applied version of its entity is acknowledged without effect.
type Order struct {
	// Entity says where the entity id is. Required.
	Entity Extractor `yaml:"entity"`
	// Version says where the (numeric) version is. Required.
	Version Extractor `yaml:"version"`
}

// DeadLetter configures what happens to a permanently failing message.
type DeadLetter struct {
	// Topic, when set, receives a record per dead letter (through the outbox).
	Topic string `yaml:"topic"`
	// MaxAttempts is how many times the effect runs before dead-lettering. Defaults to 5.
	MaxAttempts int `yaml:"max_attempts"`
}

// Lookup resolves an environment variable, like os.LookupEnv.
type Lookup func(name string) (string, bool)

// Load reads and validates the pipelines file at path, resolving secrets through lookup.
// See Parse for what it returns on error.
func Load(path string, lookup Lookup) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("error reading pipelines file: %w", err)
	}
	return Parse(path, data, lookup)
}

// Parse is Load on data read from name. When the file has problems, the error lists them
// all; the File returned beside it, when not nil, is partial and good only for more
// diagnostics (File.PrepareSQL).
func Parse(name string, data []byte, lookup Lookup) (*File, error) {
	if lookup == nil {
		lookup = func(string) (string, bool) { return "", false }
	}
	p := &parser{file: name, lookup: lookup}
	f := p.parse(data)
	if len(p.errs) > 0 {
		sort.SliceStable(p.errs, func(i, j int) bool { return p.errs[i].Line < p.errs[j].Line })
		errs := make([]error, len(p.errs))
		for i, e := range p.errs {
			errs[i] = e
		}
		// The partial file lets `idemd check` prepare the SQL of a file that has other
		// problems too, and report everything at once.
		return f, errors.Join(errs...)
	}
	return f, nil
}

// Error is one problem of a pipelines file.
type Error struct {
	// File is the pipelines file.
	File string
	// Line is the 1-based line of the field, 0 when unknown.
	Line int
	// Pipeline names the pipeline, as `sources[0] "stripe"`; "" for file-level problems.
	Pipeline string
	// Field is the dotted path of the field inside the pipeline, such as verify.scheme.
	Field string
	// Msg says what is wrong.
	Msg string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	b.WriteString(": ")
	if e.Pipeline != "" {
		b.WriteString(e.Pipeline)
		b.WriteString(": ")
	}
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Pipelines returns the names of every pipeline, sources first.
func (f *File) Pipelines() []string {
	var out []string
	for _, s := range f.Sources {
		out = append(out, s.Name)
	}
	for _, s := range f.Subscriptions {
		out = append(out, s.Name)
	}
	return out
}

// Topics returns every topic the file publishes to or consumes, sorted and unique.
func (f *File) Topics() []string {
	set := map[string]bool{}
	add := func(p *Publish) {
		if p != nil && p.Topic != "" {
			set[p.Topic] = true
		}
	}
	for _, s := range f.Sources {
		add(s.Publish)
	}
	for _, s := range f.Subscriptions {
		add(s.Publish)
		for _, t := range s.Topics {
			set[t] = true
		}
		if s.DeadLetter != nil && s.DeadLetter.Topic != "" {
			set[s.DeadLetter.Topic] = true
		}
	}
	out := make([]string, 0, len(set))
	for t := range set {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// Duration is a YAML duration: Go syntax ("24h", "90m") plus a day suffix ("30d", "1d12h").
type Duration struct {
	time.Duration
	raw string
	err error
}

// UnmarshalYAML keeps the parse error for validation, which names the field.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	d.raw = n.Value
	if n.Kind != yaml.ScalarNode {
		d.err = fmt.Errorf("want a duration such as 30d or 24h")
		return nil
	}
	d.Duration, d.err = ParseDuration(n.Value)
	return nil
}

// ParseDuration parses a Go duration with an optional leading day count: "30d", "1d12h",
// "24h", "5m".
func ParseDuration(s string) (time.Duration, error) {
	bad := fmt.Errorf("invalid duration %q: want a number with a unit d, h, m, s or ms, such as 30d or 24h", s)
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, bad
	}
	var days time.Duration
	if i := strings.IndexByte(s, 'd'); i >= 0 {
		var n int64
		if _, err := fmt.Sscanf(s[:i], "%d", &n); err != nil || fmt.Sprint(n) != s[:i] || n < 0 || n > 100000 {
			return 0, bad
		}
		days = time.Duration(n) * 24 * time.Hour
		s = s[i+1:]
		if s == "" {
			return days, nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 || d > math.MaxInt64-days {
		return 0, bad
	}
	return days + d, nil
}

// StringList is a YAML sequence of strings that also accepts a single string.
type StringList struct {
	Values []string
	err    error
}

// UnmarshalYAML accepts "X" and [X, Y].
func (l *StringList) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		l.Values = []string{n.Value}
	case yaml.SequenceNode:
		for _, c := range n.Content {
			if c.Kind != yaml.ScalarNode {
				l.err = fmt.Errorf("want a list of environment variable names")
				return nil
			}
			l.Values = append(l.Values, c.Value)
		}
	default:
		l.err = fmt.Errorf("want a list of environment variable names")
	}
	return nil
}

// Errorf returns an *Error about field of the source, with its line, for problems found
// after Load (by the packages the file is mapped onto).
func (s *Source) Errorf(field, format string, args ...any) error {
	return s.loc.errorf(field, format, args...)
}

// Errorf returns an *Error about field of the subscription, with its line.
func (s *Subscription) Errorf(field, format string, args ...any) error {
	return s.loc.errorf(field, format, args...)
}

// Package pipeline is the vocabulary that idemd's doors and its pipelines file share: where
// a value is read from a message (Field, composite ids), what a pipeline publishes (Targets
// of Publish, with their filters and operation ids), the stale-event guard (Order),
// dead-lettering (DeadLetter), durations with days, and the defaults. The pipelines file decodes straight into the doors' configs
// (receiver.Source, consumer.Config), which are built from these types: each fact is
// defined once, here or in the door that owns it.
package pipeline

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/idemd/idemd/delivery"
	"github.com/idemd/idemd/internal/jsonpointer"
)

// Defaults shared by the doors.
const (
	// RetentionDefault is how long webhook and subscription dedup records are kept: longer
	// than Stripe's and Svix's retry horizons (3 days, 27 h) with margin (SPEC 3.2).
	RetentionDefault = 7 * 24 * time.Hour
	// IdempotencyRetentionDefault is how long API idempotency keys are kept.
	IdempotencyRetentionDefault = 24 * time.Hour
	// MaxAttemptsDefault is how many times a permanently failing effect fails (each in a
	// savepoint) before its message is dead-lettered (DeadLetter.MaxAttempts).
	MaxAttemptsDefault = 5
)

// Field says where a value is read from a message: exactly one of a JSON pointer into the
// body, a header (HTTP header, Kafka record header), a message attribute (Pub/Sub and SQS
// subscriptions), the record key (subscriptions), or Parts, a composite of several of those
// (composite.go). In the pipelines file a composite
// is written as a list: message_id: [{json: /a}, {json: /b}].
type Field struct {
	// JSON is an RFC 6901 pointer into the JSON body, such as /data/object/id. Strings are
	// taken as they are, numbers as written.
	JSON string `yaml:"json,omitempty"`
	// Header is a header name (HTTP header, Kafka record header).
	Header string `yaml:"header,omitempty"`
	// Attribute is a message attribute name (a Pub/Sub attribute, an SQS message attribute
	// of type String or Number): Pub/Sub and SQS subscriptions only, which have no headers.
	Attribute string `yaml:"attribute,omitempty"`
	// Key takes the Kafka record key; on Pub/Sub and SQS subscriptions, the ordering key or
	// the FIFO MessageGroupId.
	Key bool `yaml:"key,omitempty"`
	// Parts makes the field a composite: each part is read, and the values are joined
	// length-prefixed (JoinParts). A missing part makes the whole value missing. Parts are
	// plain fields (json, header or key), never composites themselves.
	Parts []Field `yaml:"parts,omitempty"`
}

// Validate checks that exactly one source is set and that a pointer is a pointer. keyAllowed
// says whether the door has a record key (Kafka subscriptions); attributes are refused
// (ValidateBroker is for the doors that have them).
func (f *Field) Validate(keyAllowed bool) error {
	door := fieldHTTP
	if keyAllowed {
		door = fieldKafka
	}
	return f.validate(door)
}

// ValidateBroker is Validate for a Pub/Sub or SQS subscription: json, attribute or key
// (the ordering key or group id), not header.
func (f *Field) ValidateBroker() error { return f.validate(fieldBroker) }

// fieldDoor is the kind of door a Field is read on: what it may name.
type fieldDoor int

const (
	fieldHTTP   fieldDoor = iota // json, header
	fieldKafka                   // json, header, key
	fieldBroker                  // json, attribute, key
)

func (f *Field) validate(door fieldDoor) error {
	if len(f.Parts) > 0 {
		return f.validateParts(door)
	}
	n := 0
	if f.JSON != "" {
		n++
		if err := jsonpointer.Validate(f.JSON); err != nil {
			return fmt.Errorf("json: %w", err)
		}
	}
	if f.Header != "" {
		n++
		if door == fieldBroker {
			return errors.New("header: Pub/Sub and SQS messages have attributes, not headers: use attribute")
		}
	}
	if f.Attribute != "" {
		n++
		if door != fieldBroker {
			return errors.New("attribute: only Pub/Sub and SQS subscriptions have message attributes: use header")
		}
	}
	if f.Key {
		n++
		if door == fieldHTTP {
			return errors.New("key: only subscriptions have a record key")
		}
	}
	if n != 1 {
		options := "json and header"
		switch door {
		case fieldKafka:
			options = "json, header and key"
		case fieldBroker:
			options = "json, attribute and key"
		}
		if n == 0 {
			return errors.New("missing: set one of " + options)
		}
		return errors.New("want exactly one of " + options)
	}
	return nil
}

// String names the field for messages.
func (f *Field) String() string {
	switch {
	case f.Header != "":
		return "header " + f.Header
	case f.Attribute != "":
		return "attribute " + f.Attribute
	case f.JSON != "":
		return "json " + f.JSON
	case f.Key:
		return "the record key"
	case len(f.Parts) > 0:
		names := make([]string, len(f.Parts))
		for i := range f.Parts {
			names[i] = f.Parts[i].String()
		}
		return "[" + strings.Join(names, ", ") + "]"
	default:
		return "nothing"
	}
}

// Publish bodies.
const (
	// BodyPayload publishes the inbound message's body.
	BodyPayload = "payload"
	// BodyEffect publishes the rows the effect's SQL returned, as JSON.
	BodyEffect = "effect"
)

// Publish is one publish target of a pipeline: each applied message whose Filter matches
// writes one outbox event for it, in the effect's transaction. A pipeline's targets are
// Targets (targets.go).
type Publish struct {
	// Name names the target: it derives the operation id of its events and the name of its
	// HTTP endpoint (Targets.OperationID, Targets.Endpoint). Letters, digits, '.', '_' and
	// '-'. Defaults to the target's position in the list: "0", "1"…
	Name string `yaml:"name"`
	// Topic is the Kafka topic. One of Topic, PubSub and SQS is required unless HTTP is
	// set; they exclude each other.
	Topic string `yaml:"topic"`
	// PubSub publishes to a Google Cloud Pub/Sub topic instead (targets.go). Defaults to
	// none.
	PubSub *PubSubTarget `yaml:"pubsub"`
	// SQS publishes to an Amazon SQS queue instead (targets.go). Defaults to none.
	SQS *SQSTarget `yaml:"sqs"`
	// Key is where the event key comes from. Defaults to no key.
	Key *Field `yaml:"key"`
	// Body is BodyPayload or BodyEffect (API sources). Defaults to BodyPayload.
	Body string `yaml:"body"`
	// HTTP delivers the event by POST to an endpoint, beside or instead of a broker. The
	// endpoint is named after the pipeline and the target (Targets.Endpoint). Defaults to
	// none.
	HTTP *HTTP `yaml:"http"`
	// Filter, when set, sends the event only for the messages it matches. Defaults to
	// none: every applied message.
	Filter *Filter `yaml:"filter"`
}

// HTTP is the outbound HTTP delivery of a target's events (SPEC 2.6b, 2.3b).
type HTTP struct {
	// URL receives the POST. Required.
	URL string `yaml:"url"`
	// SecretEnv names the environment variable with the Standard Webhooks signing secret.
	// Required in the pipelines file.
	SecretEnv string `yaml:"secret_env"`
	// Secret is the signing secret (the value of SecretEnv). Never logged.
	Secret string `yaml:"-"`
	// Timeout bounds one delivery. Defaults to 10 s (delivery.TimeoutDefault).
	Timeout time.Duration `yaml:"timeout"`
	// Rate caps the requests per second to the endpoint, all idemd processes together.
	// Defaults to 0: no cap.
	Rate float64 `yaml:"rate"`
	// Breaker, when set, stops sending to an endpoint that keeps failing (delivery.Breaker).
	// Defaults to none: only a 410 stops deliveries.
	Breaker *delivery.Breaker `yaml:"breaker"`
	// Retry overrides the deliverer's retry policy for this endpoint. Defaults to the
	// deliverer's (20 attempts within 24 h, backoff 5 s to 2 h).
	Retry delivery.RetryPolicy `yaml:"retry"`
}

// Validate checks p for a door; keyAllowed says whether the door has a record key.
func (p *Publish) Validate(keyAllowed bool) error {
	door := fieldHTTP
	if keyAllowed {
		door = fieldKafka
	}
	return p.validate(door)
}

// ValidateBroker is Validate for a Pub/Sub or SQS subscription: its key reads json, an
// attribute or the message's ordering key or group id (Field.ValidateBroker).
func (p *Publish) ValidateBroker() error { return p.validate(fieldBroker) }

func (p *Publish) validate(door fieldDoor) error {
	if err := p.ValidateDestination(); err != nil {
		return err
	}
	if p.Name != "" && !ValidName(p.Name) {
		return fmt.Errorf("name: %q is not a valid name: letters, digits, '.', '_' and '-', at most 100", p.Name)
	}
	if p.Key != nil {
		if err := p.Key.validate(door); err != nil {
			return fmt.Errorf("key: %w", err)
		}
	}
	switch p.Body {
	case "", BodyPayload, BodyEffect:
	default:
		return fmt.Errorf("body: unknown body %q (known: payload, effect)", p.Body)
	}
	if p.Filter != nil {
		if err := p.Filter.Validate(door != fieldHTTP); err != nil {
			return fmt.Errorf("filter: %w", err)
		}
	}
	return nil
}

// Order is the stale-event guard: a message whose version is not newer than the last
// applied version of its entity is acknowledged without its effect. Versions are decimal
// numbers, or RFC 3339 timestamps compared as microseconds since the Unix epoch.
type Order struct {
	// Entity says where the entity id is. Required.
	Entity Field `yaml:"entity"`
	// Version says where the version is. Required.
	Version Field `yaml:"version"`
}

// DeadLetter says what happens to a message whose effect keeps failing.
type DeadLetter struct {
	// Topic, when set, receives a record per dead letter, through the outbox. Defaults to
	// none: a dead_letters row only.
	Topic string `yaml:"topic"`
	// MaxAttempts is how many failed attempts of its own a message gets before it is
	// dead-lettered: the effect failing permanently this many times. It does not bound how
	// often the effect (a Go Handler) runs: when another message of the same batch fails
	// transiently, the batch is rolled back and retried, and every effect in it runs again.
	// Nothing of a rolled-back run is applied (its writes through tx are undone), but what
	// an effect does outside the transaction (an HTTP call, a file) happens once per run,
	// so it must be idempotent. Defaults to 5.
	MaxAttempts int `yaml:"max_attempts"`
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

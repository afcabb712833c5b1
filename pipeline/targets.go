package pipeline

import (
	"errors"
	"fmt"
	"maps"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/google/uuid"

	"github.com/idemd/idemd/outbox"
)

// Targets are a pipeline's publish targets (fan-out): each applied message writes one
// outbox event per target whose filter matches it, in the effect's transaction. In the
// pipelines file, publish is one target or a list of them.
//
// Each event's operation id is derived from the pipeline's scope, the message id and the
// target's name (outbox.TargetOperationID), so that every target gets its own id, stable
// across retries and replays: one target's retry is never taken downstream for another
// target's event. An unnamed target is named by its position, and the id of position n is
// outbox.OperationID(scope, id, n): a pipeline with one unnamed target keeps the operation
// ids it had before targets could be several.
type Targets []Publish

var validName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._-]{0,99}$`)

// ValidName reports whether name can name a pipeline or a target: 1 to 100 letters, digits,
// '.', '_' and '-', starting with a letter or digit.
func ValidName(name string) bool { return validName.MatchString(name) }

// Name is the name of target i: its Name, or its position.
func (ts Targets) Name(i int) string {
	if ts[i].Name != "" {
		return ts[i].Name
	}
	return strconv.Itoa(i)
}

// Endpoint is the name of target i's HTTP endpoint (delivery.Endpoint.Name) in pipeline:
// "{pipeline}:{target}", except for the target named "0" (the first, unnamed), whose
// endpoint is named after the pipeline, as every pipeline's one endpoint was before targets
// could be several. ':' cannot appear in a pipeline's name, so no two endpoints share a name.
func (ts Targets) Endpoint(pipeline string, i int) string {
	if name := ts.Name(i); name != "0" {
		return pipeline + ":" + name
	}
	return pipeline
}

// OperationID is the operation id of the event that message id of scope sends to target i.
func (ts Targets) OperationID(scope, id string, i int) uuid.UUID {
	return outbox.TargetOperationID(scope, id, ts.Name(i))
}

// Validate checks every target, and that their names (given or by position) are unique.
// keyAllowed says whether the door has a record key.
func (ts Targets) Validate(keyAllowed bool) error {
	return ts.validate(func(p *Publish) error { return p.Validate(keyAllowed) })
}

// ValidateBroker is Validate for a Pub/Sub or SQS subscription (Publish.ValidateBroker).
func (ts Targets) ValidateBroker() error { return ts.validate((*Publish).ValidateBroker) }

func (ts Targets) validate(check func(*Publish) error) error {
	seen := map[string]int{}
	for i := range ts {
		if err := check(&ts[i]); err != nil {
			return fmt.Errorf("[%d]: %w", i, err)
		}
		name := ts.Name(i)
		if j, ok := seen[name]; ok {
			return fmt.Errorf("[%d]: name %q is also the name of target %d (unnamed targets are named by their position)", i, name, j)
		}
		seen[name] = i
	}
	return nil
}

// Message is what the targets read of one applied message.
type Message interface {
	// Field reads a plain field (json, header or key) of the message; ok is false when it
	// is absent.
	Field(f *Field) (string, bool)
	// EventType is the provider's event type ("" when unknown): Stripe's and Standard
	// Webhooks' /type, GitHub's X-GitHub-Event, a record's event-type header.
	EventType() string
}

// Routed is the event a message sends to one target.
type Routed struct {
	// Target is the target, and Index its position.
	Target *Publish
	Index  int
	// Event is the outbox event.
	Event outbox.Event
}

// Route returns the events that msg, a message of pipeline with id in scope, sends: one per
// target whose filter matches, in the targets' order. Each is base (payload, headers,
// causation) sent to the target: its destination (Publish.Destination) and endpoint, its
// key, its operation id.
func (ts Targets) Route(pipeline, scope, id string, base outbox.Event, msg Message) []Routed {
	return ts.AppendRoute(nil, pipeline, scope, id, base, msg)
}

// AppendRoute is Route appending the events to dst, so that a caller may route into room
// it has (the Kafka door routes each record into a buffer on its stack).
func (ts Targets) AppendRoute(dst []Routed, pipeline, scope, id string, base outbox.Event, msg Message) []Routed {
	out, first := dst, len(dst)
	for i := range ts {
		t := &ts[i]
		if t.Filter != nil && !t.Filter.Match(msg) {
			continue
		}
		ev := base
		if len(out) > first {
			// The first event keeps base's map (one target: no copy); the others get theirs.
			ev.Headers = maps.Clone(base.Headers)
		}
		ev.Pipeline, ev.CausationID = pipeline, id
		ev.Topic = t.Destination()
		ev.OperationID = ts.OperationID(scope, id, i)
		if t.HTTP != nil {
			ev.Endpoint = ts.Endpoint(pipeline, i)
		}
		if t.Key != nil {
			if k, ok := t.Key.Read(msg.Field); ok && k != "" {
				ev.Key = []byte(k)
			}
		}
		out = append(out, Routed{Target: t, Index: i, Event: ev})
	}
	return out
}

// PubSubTarget is a Google Cloud Pub/Sub topic a target publishes to (SPEC 2.5b): one
// message per event, the event key as ordering key, operation-id, causation-id and
// idemd-pipeline as attributes (outbox.PubSubPublisher).
type PubSubTarget struct {
	// Topic is a topic id of the client's project (PUBSUB_PROJECT_ID or
	// GOOGLE_CLOUD_PROJECT) or a full name, projects/PROJECT/topics/ID. idemd does not
	// create it outside `idemd dev`. Required.
	Topic string `yaml:"topic"`
}

// SQSTarget is an Amazon SQS queue a target publishes to (SPEC 2.5b): one message per
// event with operation-id, causation-id and idemd-pipeline as String message attributes;
// on a FIFO queue the event key is the MessageGroupId and the operation id the
// MessageDeduplicationId (outbox.SQSPublisher).
type SQSTarget struct {
	// Queue is a queue name (resolved with GetQueueUrl; a FIFO queue's ends in .fifo) or a
	// queue URL. idemd does not create it outside `idemd dev`. Required.
	Queue string `yaml:"queue"`
}

// Destination is where the target's events go, as outbox.Event.Topic encodes it: the
// Kafka topic, outbox.PubSubDestination(topic) or outbox.SQSDestination(queue); "" for an
// HTTP-only target.
func (p *Publish) Destination() string {
	switch {
	case p.PubSub != nil:
		return outbox.PubSubDestination(p.PubSub.Topic)
	case p.SQS != nil:
		return outbox.SQSDestination(p.SQS.Queue)
	}
	return p.Topic
}

// Brokers lists the broker destinations p names, as the pipelines file writes them
// ("topic", "pubsub", "sqs"): one at most is valid.
func (p *Publish) Brokers() []string {
	var out []string
	if p.Topic != "" {
		out = append(out, "topic")
	}
	if p.PubSub != nil {
		out = append(out, "pubsub")
	}
	if p.SQS != nil {
		out = append(out, "sqs")
	}
	return out
}

// ValidateDestination checks that p names one broker destination (topic, pubsub or sqs),
// or HTTP alone, and that the name is one its broker takes. An error about one field
// starts with its path ("sqs.queue: required").
func (p *Publish) ValidateDestination() error {
	brokers := p.Brokers()
	switch {
	case len(brokers) == 0 && p.HTTP == nil:
		return errors.New("want topic, pubsub, sqs or http (http may go with one of the others)")
	case len(brokers) > 1:
		return fmt.Errorf("%s: one broker per target; list a target for each", strings.Join(brokers, ", "))
	case p.Topic != "":
		if err := outbox.CheckKafkaTopic(p.Topic); err != nil {
			return fmt.Errorf("topic: %w", err)
		}
	case p.PubSub != nil && p.PubSub.Topic == "":
		return errors.New("pubsub.topic: required")
	case p.PubSub != nil:
		if err := outbox.CheckPubSubTopic(p.PubSub.Topic); err != nil {
			return fmt.Errorf("pubsub.topic: %w", err)
		}
	case p.SQS != nil && p.SQS.Queue == "":
		return errors.New("sqs.queue: required")
	case p.SQS != nil:
		if err := outbox.CheckSQSQueue(p.SQS.Queue); err != nil {
			return fmt.Errorf("sqs.queue: %w", err)
		}
	}
	return nil
}

// Filter narrows the messages a target receives: by event type, by a value, or both (both
// must match).
type Filter struct {
	// Type lists globs over the message's event type (Message.EventType), with path.Match's
	// syntax: "invoice.*", "charge.refund?", "push". One match is enough; a message without
	// an event type matches none. Defaults to none (no type condition).
	Type []string `yaml:"type"`
	// JSON is a pointer into the body whose value must be one of In. Defaults to none.
	JSON string `yaml:"json"`
	// Header is a header whose value must be one of In. Defaults to none.
	Header string `yaml:"header"`
	// In lists the accepted values of JSON or Header, compared as text (numbers as
	// written). Required with JSON or Header.
	In []string `yaml:"in"`
}

// Validate checks the globs and that the filter says something.
func (f *Filter) Validate(keyAllowed bool) error {
	for i, g := range f.Type {
		if _, err := path.Match(g, ""); err != nil || g == "" {
			return fmt.Errorf("type[%d]: %q is not a glob (path.Match syntax: *, ?, [a-z])", i, g)
		}
	}
	value := f.JSON != "" || f.Header != ""
	switch {
	case !value && len(f.In) > 0:
		return errors.New("in: needs json or header: where the value is read")
	case len(f.Type) == 0 && !value:
		return errors.New("want type (globs over the event type), json or header with in, or both")
	case value && len(f.In) == 0:
		return errors.New("in: required with json or header: the accepted values")
	}
	if value {
		if err := f.value().Validate(keyAllowed); err != nil {
			return err
		}
	}
	return nil
}

func (f *Filter) value() *Field { return &Field{JSON: f.JSON, Header: f.Header} }

// Match reports whether msg passes the filter.
func (f *Filter) Match(msg Message) bool {
	if len(f.Type) > 0 {
		t := msg.EventType()
		if t == "" || !slices.ContainsFunc(f.Type, func(g string) bool { ok, _ := path.Match(g, t); return ok }) {
			return false
		}
	}
	if f.JSON != "" || f.Header != "" {
		v, ok := msg.Field(f.value())
		if !ok || !slices.Contains(f.In, v) {
			return false
		}
	}
	return true
}

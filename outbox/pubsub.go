package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
	"unicode/utf8"

	"cloud.google.com/go/pubsub/v2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// PubSubPublishTimeoutDefault bounds one publish to Pub/Sub unless configured otherwise.
const PubSubPublishTimeoutDefault = 60 * time.Second

// pubSubMaxOrderingKey is the longest ordering key Pub/Sub accepts, in bytes.
const pubSubMaxOrderingKey = 1024

// PubSubPublisherConfig configures a PubSubPublisher.
type PubSubPublisherConfig struct {
	// Timeout bounds the publish of one message, retries included. Defaults to 60 s.
	Timeout time.Duration
}

// PubSubPublisher publishes outbox events to Google Cloud Pub/Sub: one message per event, its
// payload as data, the event's headers with operation-id, causation-id and idemd-pipeline as
// attributes, and its key as the ordering key. Event.Topic is a topic id of the client's
// project or a full name (projects/P/topics/T).
type PubSubPublisher struct {
	client  *pubsub.Client
	timeout time.Duration

	mu         sync.Mutex
	publishers map[string]*pubsub.Publisher
}

// NewPubSubPublisher returns a publisher on client; cfg may be nil.
func NewPubSubPublisher(client *pubsub.Client, cfg *PubSubPublisherConfig) (*PubSubPublisher, error) {
	if client == nil {
		return nil, errors.New("outbox: NewPubSubPublisher: client is required")
	}
	c := PubSubPublisherConfig{}
	if cfg != nil {
		c = *cfg
	}
	if c.Timeout < 0 {
		return nil, fmt.Errorf("outbox: PubSubPublisherConfig.Timeout must not be negative, got %s", c.Timeout)
	}
	return &PubSubPublisher{
		client:     client,
		timeout:    cmp.Or(c.Timeout, PubSubPublishTimeoutDefault),
		publishers: map[string]*pubsub.Publisher{},
	}, nil
}

func (p *PubSubPublisher) publisher(topic string) *pubsub.Publisher {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.publishers[topic]
	if !ok {
		t = p.client.Publisher(topic)
		// Ordering keys keep each key's order; messages without a key are not held by it.
		// A failed message pauses its key: later ones fail with ErrPublishingPaused.
		t.EnableMessageOrdering = true
		t.PublishSettings.Timeout = p.timeout
		p.publishers[topic] = t
	}
	return t
}

// Publish publishes events and waits for the broker's answer to each. See Publisher.
func (p *PubSubPublisher) Publish(ctx context.Context, events []Event) []error {
	errs := make([]error, len(events))
	results := make([]*pubsub.PublishResult, len(events))
	for i := range events {
		e := &events[i]
		if errs[i] = checkPubSub(e); errs[i] != nil {
			continue
		}
		results[i] = p.publisher(e.Topic).Publish(ctx, &pubsub.Message{
			Data: e.Payload, Attributes: attributes(e), OrderingKey: string(e.Key),
		})
	}
	for i, r := range results {
		if r == nil {
			continue
		}
		if _, err := r.Get(ctx); err != nil {
			var held pubsub.ErrPublishingPaused
			if errors.As(err, &held) {
				errs[i] = keyFailed(events[i].Topic, events[i].Key)
			} else {
				errs[i] = classifyPubSub(events[i].Topic, err)
			}
		}
	}
	p.resume(events, errs)
	// The client sends the messages of a round in batches, and Pub/Sub refuses a batch
	// as a whole: publish the refused events again one at a time, in order, so that only
	// the culprits fail permanently.
	var suspects []int
	for i, err := range errs {
		if results[i] != nil && errors.Is(err, ErrPermanent) && !errors.Is(err, ErrNoDestination) {
			suspects = append(suspects, i)
		}
	}
	if len(suspects) > 1 {
		failed := map[[2]string]bool{}
		for _, i := range suspects {
			e := &events[i]
			k := [2]string{e.Topic, string(e.Key)}
			if len(e.Key) > 0 && failed[k] {
				errs[i] = keyFailed(e.Topic, e.Key)
				continue
			}
			_, err := p.publisher(e.Topic).Publish(ctx, &pubsub.Message{Data: e.Payload, Attributes: attributes(e), OrderingKey: string(e.Key)}).Get(ctx)
			if errs[i] = err; err != nil {
				errs[i] = classifyPubSub(e.Topic, err)
				failed[k] = true
			}
		}
		p.resume(events, errs)
	}
	return errs
}

// resume lets the next round publish the keys of the failed events: the client pauses a key
// on its first failure.
func (p *PubSubPublisher) resume(events []Event, errs []error) {
	for i, err := range errs {
		if err != nil && len(events[i].Key) > 0 && events[i].Topic != "" {
			p.publisher(events[i].Topic).ResumePublish(string(events[i].Key))
		}
	}
}

// Close flushes and stops the per-topic publishers. The client stays open.
func (p *PubSubPublisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, t := range p.publishers {
		t.Stop()
	}
	p.publishers = map[string]*pubsub.Publisher{}
	return nil
}

// checkPubSub refuses what Pub/Sub would refuse on every attempt, before sending it.
func checkPubSub(e *Event) error {
	if err := checkPublishable(e); err != nil {
		return err
	}
	switch {
	case !utf8.Valid(e.Key):
		return permanent("the event key is not UTF-8; Pub/Sub ordering keys are strings")
	case len(e.Key) > pubSubMaxOrderingKey:
		return permanent("the event key has %d bytes; Pub/Sub ordering keys have at most %d", len(e.Key), pubSubMaxOrderingKey)
	}
	return nil
}

// classifyPubSub wraps a publish error with its class: the topic is missing, or Pub/Sub
// refuses the message itself (too large, an invalid attribute), or transient.
func classifyPubSub(topic string, err error) error {
	wrapped := fmt.Errorf("error publishing to Pub/Sub topic %s: %w", topic, err)
	if errors.Is(err, pubsub.ErrOversizedMessage) {
		return &publishError{err: wrapped, permanent: true}
	}
	if s, ok := status.FromError(err); ok {
		switch s.Code() {
		case codes.NotFound:
			return noDestination(wrapped)
		case codes.InvalidArgument, codes.OutOfRange:
			return &publishError{err: wrapped, permanent: true}
		}
	}
	return wrapped
}

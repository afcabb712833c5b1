package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2"
)

// Defaults of pubsubSourceConfig.
const (
	pubsubMaxOutstandingDefault = 1000
	pubsubMaxExtensionDefault   = 10 * time.Minute
	pubsubReceiveMaxDefault     = 500
	pubsubStreamsDefault        = 1
)

// pubsubSourceConfig configures a pubsubSource.
type pubsubSourceConfig struct {
	// Subscription is a subscription id of the client's project or a full name
	// (projects/P/subscriptions/S). Required.
	Subscription string
	// MaxOutstanding bounds the messages received and not yet acknowledged or released
	// (the client's flow control). Defaults to 1000.
	MaxOutstanding int
	// MaxExtension bounds how long the client keeps extending a held message's ack
	// deadline (by at least 10 s at a time, following the observed processing time); after
	// it the message is redelivered. Defaults to 10 minutes.
	MaxExtension time.Duration
	// ExtensionPeriod, when set, is the ack deadline the client asks for at receipt and on
	// each extension (at least 6 s: the client's first extension comes 5 s after the
	// stream opens). Defaults to the client's choice, 10 s to 10 minutes following the
	// observed processing time.
	ExtensionPeriod time.Duration
	// ReceiveMax is the most messages one Receive returns. Defaults to 500.
	ReceiveMax int
	// Streams is how many streaming pulls the client opens (NumGoroutines). They share
	// MaxOutstanding (the client's flow control across streams). Defaults to 1.
	Streams int
}

// pubsubSource receives a Pub/Sub subscription through the client's streaming pull
// (Subscriber.Receive), which leases every message it hands out (extending its ack deadline)
// until Ack, Nack or MaxExtension. Its callback only queues the message and returns: on an
// ordered subscription the client calls it for one ordering key in order, so the queue keeps
// each key's order. That holds with several streams too: Pub/Sub sends one ordering key's
// messages on one stream, and the client's scheduler, shared by the streams, calls back one
// key's messages one after the other in the order their stream received them. Receive must
// be called from one goroutine: two could take one key's messages apart and return them out
// of order.
type pubsubSource struct {
	cfg    pubsubSourceConfig
	queue  chan *brokerMessage
	cancel context.CancelFunc
	done   chan struct{}
	err    error // Receive's error, once done is closed

	mu   sync.Mutex
	held map[*brokerMessage]struct{} // handed out by Receive, neither acked nor released

	closeOnce sync.Once
}

// newPubSubSource starts receiving from the subscription; call Close to stop.
func newPubSubSource(client *pubsub.Client, cfg pubsubSourceConfig) (*pubsubSource, error) {
	if client == nil {
		return nil, errors.New("pubsub source: client is required")
	}
	if cfg.Subscription == "" {
		return nil, errors.New("pubsub source: subscription is required")
	}
	if cfg.ExtensionPeriod != 0 && cfg.ExtensionPeriod < 6*time.Second {
		return nil, fmt.Errorf("pubsub source: ExtensionPeriod must be at least 6s, got %s", cfg.ExtensionPeriod)
	}
	cfg.MaxOutstanding = cmp.Or(cfg.MaxOutstanding, pubsubMaxOutstandingDefault)
	cfg.MaxExtension = cmp.Or(cfg.MaxExtension, pubsubMaxExtensionDefault)
	cfg.ReceiveMax = cmp.Or(cfg.ReceiveMax, pubsubReceiveMaxDefault)
	cfg.Streams = cmp.Or(cfg.Streams, pubsubStreamsDefault)
	sub := client.Subscriber(cfg.Subscription)
	sub.ReceiveSettings.MaxOutstandingMessages = cfg.MaxOutstanding
	// One flow control for all the streams (EnablePerStreamFlowControl off): MaxOutstanding
	// bounds what the source holds, whatever the number of streams.
	sub.ReceiveSettings.NumGoroutines = cfg.Streams
	sub.ReceiveSettings.EnablePerStreamFlowControl = false
	sub.ReceiveSettings.MaxExtension = cfg.MaxExtension
	sub.ReceiveSettings.MaxDurationPerAckExtension = cfg.ExtensionPeriod
	sub.ReceiveSettings.MinDurationPerAckExtension = cfg.ExtensionPeriod
	// The client's graceful shutdown: Receive returns once every message it handed out was
	// acked or nacked, and the acks were sent. Close nacks what is still held first.
	sub.ReceiveSettings.ShutdownOptions = nil

	ctx, cancel := context.WithCancel(context.Background())
	s := &pubsubSource{cfg: cfg, queue: make(chan *brokerMessage), cancel: cancel, done: make(chan struct{}), held: map[*brokerMessage]struct{}{}}
	go func() {
		defer close(s.done)
		s.err = sub.Receive(ctx, func(ctx context.Context, m *pubsub.Message) {
			select {
			case s.queue <- fromPubSub(m):
			case <-ctx.Done():
				m.Nack()
			}
		})
		if s.err == nil {
			s.err = fmt.Errorf("%w: pubsub source closed", errSourceStopped)
		} else {
			s.err = fmt.Errorf("%w: error receiving from Pub/Sub subscription %s: %w", errSourceStopped, cfg.Subscription, s.err)
		}
	}()
	return s, nil
}

func fromPubSub(m *pubsub.Message) *brokerMessage {
	b := &brokerMessage{
		ID: m.ID, Ordered: m.OrderingKey != "", Lane: m.OrderingKey, Body: m.Data, Attributes: m.Attributes,
		PublishTime: m.PublishTime, ReceivedAt: time.Now(), handle: m,
	}
	if m.DeliveryAttempt != nil {
		b.DeliveryAttempt = *m.DeliveryAttempt
	}
	if b.Attributes == nil {
		b.Attributes = map[string]string{}
	}
	return b
}

// Receive returns the messages queued so far (at least one, at most ReceiveMax). It fails
// when the streaming pull stopped for good (a missing subscription, say).
func (s *pubsubSource) Receive(ctx context.Context) ([]*brokerMessage, error) {
	var first *brokerMessage
	select {
	case first = <-s.queue:
	case <-s.done:
		return nil, s.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	msgs := []*brokerMessage{first}
	for more := true; more && len(msgs) < s.cfg.ReceiveMax; {
		select {
		case m := <-s.queue:
			msgs = append(msgs, m)
		default:
			more = false
		}
	}
	s.mu.Lock()
	for _, m := range msgs {
		s.held[m] = struct{}{}
	}
	s.mu.Unlock()
	return msgs, nil
}

// Ack acknowledges msgs. Without exactly-once delivery on the subscription the client sends
// acks in the background and reports no outcome; with it, Ack waits for Pub/Sub's answer.
func (s *pubsubSource) Ack(ctx context.Context, msgs []*brokerMessage) error {
	return s.settle(ctx, msgs, (*pubsub.Message).AckWithResult)
}

// Release nacks msgs: Pub/Sub redelivers them at once (after the subscription's retry
// policy's backoff, when it has one). On an ordered subscription it also redelivers the
// later messages of their ordering keys.
func (s *pubsubSource) Release(ctx context.Context, msgs []*brokerMessage) error {
	return s.settle(ctx, msgs, (*pubsub.Message).NackWithResult)
}

func (s *pubsubSource) settle(ctx context.Context, msgs []*brokerMessage, op func(*pubsub.Message) *pubsub.AckResult) error {
	results := make([]*pubsub.AckResult, len(msgs))
	s.mu.Lock()
	for i, m := range msgs {
		delete(s.held, m)
		results[i] = op(m.handle.(*pubsub.Message))
	}
	s.mu.Unlock()
	var errs []error
	for i, r := range results {
		if _, err := r.Get(ctx); err != nil {
			errs = append(errs, fmt.Errorf("message %s: %w", msgs[i].ID, err))
		}
	}
	return errors.Join(errs...)
}

// Close stops the streaming pull, nacks the messages still held, and returns once the
// client sent every ack and nack.
func (s *pubsubSource) Close() error {
	s.closeOnce.Do(func() {
		// The callbacks waiting on the queue see the cancelled ctx and nack.
		s.cancel()
		s.mu.Lock()
		for m := range s.held {
			m.handle.(*pubsub.Message).Nack()
		}
		clear(s.held)
		s.mu.Unlock()
		<-s.done
	})
	return nil
}

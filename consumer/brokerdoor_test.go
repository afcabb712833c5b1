package consumer_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/consumer"
	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/internal/doortest"
	"github.com/idemd/idemd/internal/pubsubtest"
	"github.com/idemd/idemd/internal/sqstest"
	"github.com/idemd/idemd/pipeline"
)

// TestConformancePubSub runs the doors' conformance suite through a Pub/Sub subscription
// (pstest, the official client).
func TestConformancePubSub(t *testing.T) {
	t.Parallel()
	doortest.Run(t, func(t *testing.T, env *doortest.Env) doortest.Door {
		topic := pubsubtest.Topic(t)
		sub := pubsubtest.Subscription(t, topic, pubsubtest.SubscriptionConfig{})
		pub := pubsubtest.Client(t).Publisher(topic)
		t.Cleanup(pub.Stop)
		d := newBrokerDoor(env, func(t *testing.T, body []byte) string {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			id, err := pub.Publish(ctx, &pubsub.Message{Data: body}).Get(ctx)
			require.NoError(t, err)
			return id
		}, func(cfg *consumer.Config) {
			cfg.PubSub, cfg.PubSubClient = &consumer.PubSub{Subscription: sub}, pubsubtest.Client(t)
			// A frozen consumer's messages come back 6 s after receipt: their lease is no
			// longer extended after 1 s.
			cfg.Lease, cfg.MaxLease = 6*time.Second, time.Second
		})
		d.start(t)
		return d
	})
}

// TestConformanceSQS runs the doors' conformance suite through an SQS queue (goaws, the
// official client).
func TestConformanceSQS(t *testing.T) {
	t.Parallel()
	doortest.Run(t, func(t *testing.T, env *doortest.Env) doortest.Door {
		url := sqstest.Queue(t, nil)
		d := newBrokerDoor(env, func(t *testing.T, body []byte) string {
			return sqstest.Send(t, url, sqstest.Message{Body: string(body)})[0]
		}, func(cfg *consumer.Config) {
			cfg.SQS, cfg.SQSClient = &consumer.SQS{Queue: url}, sqstest.Client(t)
			// A frozen consumer's messages come back within 4 s of receipt (goaws expires
			// visibility on a 1-second tick: a 1 s lease may end early).
			cfg.Lease, cfg.MaxLease = 2*time.Second, 2*time.Second
		})
		d.start(t)
		return d
	})
}

// brokerDoor is a Pub/Sub or SQS subscription under the conformance suite. It tracks the
// broker ids it sent and those the consumers acknowledged (OnAck).
type brokerDoor struct {
	env     *doortest.Env
	send    func(t *testing.T, body []byte) string
	source  func(cfg *consumer.Config)
	current *consumer.Consumer

	mu      sync.Mutex
	sent    map[string]bool
	acked   map[string]bool
	changed chan struct{}

	armed   atomic.Bool
	crashed chan struct{} // closed when the armed crash froze a consumer
	thaw    chan struct{} // closed at cleanup: the frozen consumer may go on
	thawed  sync.Once
}

func newBrokerDoor(env *doortest.Env, send func(*testing.T, []byte) string, source func(*consumer.Config)) *brokerDoor {
	return &brokerDoor{
		env: env, send: send, source: source, sent: map[string]bool{}, acked: map[string]bool{},
		changed: make(chan struct{}, 1), crashed: make(chan struct{}), thaw: make(chan struct{}),
	}
}

// start runs a consumer of the door's pipeline until the test ends.
func (d *brokerDoor) start(t *testing.T) {
	cfg := &consumer.Config{
		Name: d.env.Pipeline, Schema: d.env.DB.Schema,
		MessageID: &pipeline.Field{JSON: "/id"}, Effect: consumer.Effect{SQL: d.env.EffectSQL},
		DeadLetter: pipeline.DeadLetter{MaxAttempts: 1}, BatchSize: 20, BatchesInFlight: 3,
		BackoffMin: 5 * time.Millisecond, BackoffMax: 50 * time.Millisecond, Logger: testLogger(),
		AfterCommit: func([]consumer.Message) {
			if d.armed.CompareAndSwap(true, false) {
				close(d.crashed)
				<-d.thaw // frozen: committed in PostgreSQL, never acknowledged to the broker
			}
		},
		OnAck: func(batch []consumer.Message) {
			d.mu.Lock()
			for _, m := range batch {
				d.acked[m.BrokerID] = true
			}
			d.mu.Unlock()
			select {
			case d.changed <- struct{}{}:
			default:
			}
		},
	}
	d.source(cfg)
	c, err := consumer.New(d.env.DB.Pool, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	t.Cleanup(func() {
		d.thawed.Do(func() { close(d.thaw) })
		cancel()
		<-done
	})
	d.current = c
}

func (d *brokerDoor) Send(t *testing.T, _ string, body []byte) {
	id := d.send(t, body)
	d.mu.Lock()
	d.sent[id] = true
	d.mu.Unlock()
}

// Settle waits, on the consumers' acknowledgements, until every message sent was
// acknowledged.
func (d *brokerDoor) Settle(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		d.mu.Lock()
		missing := 0
		for id := range d.sent {
			if !d.acked[id] {
				missing++
			}
		}
		d.mu.Unlock()
		if missing == 0 {
			return
		}
		select {
		case <-d.changed:
		case <-ctx.Done():
			t.Fatalf("the consumer did not acknowledge %d of %d messages", missing, len(d.sent))
		}
	}
}

func (d *brokerDoor) CrashAfterCommit(*testing.T) { d.armed.Store(true) }

// Restart starts a second consumer once the first froze; the frozen one's messages come
// back once their lease ends (MaxLease).
func (d *brokerDoor) Restart(t *testing.T) {
	select {
	case <-d.crashed:
	case <-time.After(30 * time.Second):
		t.Fatal("the armed crash did not happen")
	}
	d.start(t)
}

func (d *brokerDoor) RegisterReplay(_ *testing.T, rp *deadletter.Replayer) {
	d.current.RegisterReplay(rp)
}

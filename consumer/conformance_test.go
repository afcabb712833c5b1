package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/consumer"
	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/internal/doortest"
	"github.com/idemd/idemd/internal/kafkatest"
	"github.com/idemd/idemd/pipeline"
)

// TestConformance runs the doors' conformance suite through Kafka: records produced round
// robin over three partitions, so that copies of one id meet in concurrent transactions.
func TestConformance(t *testing.T) {
	t.Parallel()
	doortest.Run(t, newKafkaDoor)
}

type kafkaDoor struct {
	env     *doortest.Env
	brokers []string
	topic   string
	group   string
	writer  *kafka.Writer
	current *consumer.Consumer

	mu        sync.Mutex
	committed map[int]int64
	commits   chan struct{}

	armed   atomic.Bool
	crashed chan struct{} // closed when the armed crash froze a consumer
	thaw    chan struct{} // closed at cleanup: the frozen consumer may go on (and be fenced)
	thawed  sync.Once
}

func newKafkaDoor(t *testing.T, env *doortest.Env) doortest.Door {
	brokers := kafkatest.Brokers(t)
	d := &kafkaDoor{
		env: env, brokers: brokers, topic: kafkatest.Topic(t, 3), group: kafkatest.Group(t),
		committed: map[int]int64{}, commits: make(chan struct{}, 1),
		crashed: make(chan struct{}), thaw: make(chan struct{}),
	}
	d.writer = &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: d.topic, Balancer: &kafka.RoundRobin{},
		BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireAll}
	t.Cleanup(func() { _ = d.writer.Close() })
	d.start(t)
	return d
}

// start runs a consumer of the door's pipeline until the test ends.
func (d *kafkaDoor) start(t *testing.T) {
	cfg := &consumer.Config{
		Name: d.env.Pipeline, Brokers: d.brokers, Topics: []string{d.topic}, Group: d.group, Schema: d.env.DB.Schema,
		MessageID: &pipeline.Field{JSON: "/id"}, Effect: consumer.Effect{SQL: d.env.EffectSQL},
		DeadLetter: pipeline.DeadLetter{MaxAttempts: 1}, BatchSize: 20,
		HeartbeatInterval: 100 * time.Millisecond, SessionTimeout: 6 * time.Second, RebalanceTimeout: 3 * time.Second,
		BackoffMin: 5 * time.Millisecond, BackoffMax: 50 * time.Millisecond, Logger: testLogger(),
		AfterCommit: func([]consumer.Message) {
			if d.armed.CompareAndSwap(true, false) {
				close(d.crashed)
				<-d.thaw // frozen: committed in PostgreSQL, never acknowledged to Kafka
			}
		},
		OnOffsetCommit: func(_ string, partition int, next int64) {
			d.mu.Lock()
			d.committed[partition] = max(d.committed[partition], next)
			d.mu.Unlock()
			select {
			case d.commits <- struct{}{}:
			default:
			}
		},
	}
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

func (d *kafkaDoor) Send(t *testing.T, id string, body []byte) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, d.writer.WriteMessages(ctx, kafka.Message{Value: body}), "message %s", id)
}

// Settle waits, on the consumer's offset commits, until every partition is committed up
// to its end.
func (d *kafkaDoor) Settle(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := kafka.DialContext(ctx, "tcp", d.brokers[0])
	require.NoError(t, err)
	parts, err := conn.ReadPartitions(d.topic)
	require.NoError(t, err)
	_ = conn.Close()
	ends := map[int]int64{}
	for _, p := range parts {
		pc, err := kafka.DialLeader(ctx, "tcp", d.brokers[0], d.topic, p.ID)
		require.NoError(t, err)
		ends[p.ID], err = pc.ReadLastOffset()
		require.NoError(t, err)
		_ = pc.Close()
	}
	for {
		d.mu.Lock()
		behind := ""
		for p, end := range ends {
			if d.committed[p] < end {
				behind = fmt.Sprintf("partition %d at %d of %d", p, d.committed[p], end)
			}
		}
		d.mu.Unlock()
		if behind == "" {
			return
		}
		select {
		case <-d.commits:
		case <-ctx.Done():
			t.Fatalf("the consumer did not commit every record: %s", behind)
		}
	}
}

func (d *kafkaDoor) CrashAfterCommit(*testing.T) { d.armed.Store(true) }

// Restart starts a second member once the first froze: the group moves the frozen member's
// partitions to it after the rebalance timeout, from their last committed offsets.
func (d *kafkaDoor) Restart(t *testing.T) {
	select {
	case <-d.crashed:
	case <-time.After(30 * time.Second):
		t.Fatal("the armed crash did not happen")
	}
	d.start(t)
}

func (d *kafkaDoor) RegisterReplay(_ *testing.T, rp *deadletter.Replayer) {
	d.current.RegisterReplay(rp)
}

package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemd/idemd/consumer"
	"github.com/idemd/idemd/internal/metrics"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/internal/pubsubtest"
	"github.com/idemd/idemd/internal/sqstest"
	"github.com/idemd/idemd/internal/tracing"
	"github.com/idemd/idemd/pipeline"
)

// brokerMsg is one message a brokerEnv sends.
type brokerMsg struct {
	body       string
	attributes map[string]string
	lane       string // ordering key, FIFO group
}

// brokerEnv is one test's Pub/Sub subscription or SQS queue, with its database.
type brokerEnv struct {
	door string
	db   *pgtest.DB
	// source points a config at the subscription or queue.
	source func(cfg *consumer.Config)
	// send sends msgs in order and returns their broker ids.
	send func(t *testing.T, msgs ...brokerMsg) []string
	// acks counts the acknowledgements of the broker id (pstest only; nil on SQS).
	acks func(id string) int
	// queue is the SQS queue's URL.
	queue string

	mu    sync.Mutex
	acked map[string]int
	ch    chan struct{}
}

type brokerOptions struct {
	ordered     bool          // an ordered Pub/Sub subscription, an SQS FIFO queue
	ackDeadline time.Duration // Pub/Sub subscription's ack deadline
}

func newPubSubEnv(t *testing.T, o brokerOptions) *brokerEnv {
	fake := pubsubtest.Fake(t)
	topic := pubsubtest.Topic(t)
	sub := pubsubtest.Subscription(t, topic, pubsubtest.SubscriptionConfig{Ordered: o.ordered, AckDeadline: o.ackDeadline})
	e := newBrokerEnv(consumer.DoorPubSub)
	e.source = func(cfg *consumer.Config) {
		// The id form with Project, as a pipelines file names it.
		cfg.PubSub = &consumer.PubSub{Subscription: pubsubtest.ID(sub), Project: pubsubtest.Project}
		cfg.PubSubClient = pubsubtest.Client(t)
		// The client's shutdown may drop a message pstest handed to a closing stream, without
		// a nack (docs/brokers.md): it comes back once the deadline the client asked for
		// ends. A short one keeps the tests that restart a consumer quick and steady.
		cfg.Lease = 6 * time.Second
	}
	e.send = func(t *testing.T, msgs ...brokerMsg) []string {
		out := make([]pubsubtest.Message, len(msgs))
		for i, m := range msgs {
			out[i] = pubsubtest.Message{Data: m.body, Attributes: m.attributes, OrderingKey: m.lane}
		}
		return pubsubtest.Publish(t, topic, out...)
	}
	e.acks = func(id string) int { return fake.Message(id).Acks }
	e.db = brokerDB(t)
	return e
}

func newSQSEnv(t *testing.T, o brokerOptions) *brokerEnv {
	url := sqstest.Queue(t, nil)
	if o.ordered {
		url = sqstest.FIFOQueue(t, nil)
	}
	e := newBrokerEnv(consumer.DoorSQS)
	e.queue = url
	e.source = func(cfg *consumer.Config) {
		cfg.SQS, cfg.SQSClient = &consumer.SQS{Queue: url[strings.LastIndexByte(url, '/')+1:]}, sqstest.Client(t)
	}
	var dedup atomic.Int64
	e.send = func(t *testing.T, msgs ...brokerMsg) []string {
		out := make([]sqstest.Message, len(msgs))
		for i, m := range msgs {
			out[i] = sqstest.Message{Body: m.body, Attributes: m.attributes}
			if o.ordered {
				out[i].GroupID, out[i].DeduplicationID = m.lane, fmt.Sprint(dedup.Add(1))
			}
		}
		return sqstest.Send(t, url, out...)
	}
	e.db = brokerDB(t)
	return e
}

func newBrokerEnv(door string) *brokerEnv {
	return &brokerEnv{door: door, acked: map[string]int{}, ch: make(chan struct{}, 1)}
}

// brokerDoors runs test against a Pub/Sub subscription and an SQS queue.
func brokerDoors(t *testing.T, o brokerOptions, test func(t *testing.T, e *brokerEnv)) {
	for _, door := range []string{consumer.DoorPubSub, consumer.DoorSQS} {
		t.Run(door, func(t *testing.T) {
			t.Parallel()
			if door == consumer.DoorPubSub {
				test(t, newPubSubEnv(t, o))
			} else {
				test(t, newSQSEnv(t, o))
			}
		})
	}
}

func brokerDB(t *testing.T) *pgtest.DB {
	db := pgtest.NewWithOptions(t, pgtest.Options{MaxConns: 8})
	db.Exec(t, db.Q(`CREATE TABLE {schema}.effects (
    seq bigserial, message_id text NOT NULL, payload jsonb, topic text, part int, off bigint, lane text)`))
	return db
}

// config is a consumer of the env's subscription that records its acknowledgements.
func (e *brokerEnv) config(name string) *consumer.Config {
	cfg := &consumer.Config{
		Name: name, Schema: e.db.Schema, Effect: consumer.Effect{SQL: e.db.Q(effectSQL)}, BatchSize: 20,
		BackoffMin: 5 * time.Millisecond, BackoffMax: 50 * time.Millisecond, Logger: testLogger(),
		OnAck: func(batch []consumer.Message) {
			e.mu.Lock()
			for _, m := range batch {
				e.acked[m.BrokerID]++
			}
			e.mu.Unlock()
			select {
			case e.ch <- struct{}{}:
			default:
			}
		},
	}
	e.source(cfg)
	return cfg
}

// waitAcked waits until every id was acknowledged.
func (e *brokerEnv) waitAcked(t *testing.T, ids ...string) {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		e.mu.Lock()
		missing := 0
		for _, id := range ids {
			if e.acked[id] == 0 {
				missing++
			}
		}
		e.mu.Unlock()
		if missing == 0 {
			return
		}
		select {
		case <-e.ch:
		case <-deadline:
			t.Fatalf("%d of %d messages not acknowledged", missing, len(ids))
		}
	}
}

// requireBrokerAcks checks, where the broker counts them (pstest), that id was acknowledged
// n times; the client sends its last acks as its streams close, maybe after Run returned.
func (e *brokerEnv) requireBrokerAcks(t *testing.T, id string, n int) {
	t.Helper()
	if e.acks == nil {
		return
	}
	require.Eventually(t, func() bool { return e.acks(id) >= n }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, n, e.acks(id))
}

func (e *brokerEnv) effects(t *testing.T, where string, args ...any) int {
	t.Helper()
	return e.db.Count(t, "{schema}.effects"+where, args...)
}

// TestBrokerTransientFailureReleases: a message whose effect keeps failing transiently is
// retried, never acknowledged; when the consumer stops, it is released, not deleted, and the
// next consumer applies it once.
func TestBrokerTransientFailureReleases(t *testing.T) {
	t.Parallel()
	brokerDoors(t, brokerOptions{}, func(t *testing.T, e *brokerEnv) {
		var failing atomic.Bool
		failing.Store(true)
		calls := make(chan struct{}, 100)
		cfg := e.config("transient")
		cfg.Effect.SQL, cfg.ShutdownTimeout = "", 300*time.Millisecond
		cfg.Handler = func(ctx context.Context, tx pgx.Tx, m consumer.Message) error {
			if failing.Load() {
				calls <- struct{}{}
				return errors.New("the ledger's partner is down") // transient: retried
			}
			_, err := tx.Exec(ctx, e.db.Q(`INSERT INTO {schema}.effects (message_id) VALUES ($1)`), m.ID)
			return err
		}
		id := e.send(t, brokerMsg{body: `{"id":"x"}`})[0]
		stop := start(t, e.db, cfg)
		for range 3 { // retried
			<-calls
		}
		stop() // the batch is rolled back after ShutdownTimeout and released
		e.mu.Lock()
		require.Zero(t, e.acked[id])
		e.mu.Unlock()
		if e.acks != nil {
			require.Zero(t, e.acks(id), "never acknowledged")
		}

		failing.Store(false)
		stop = start(t, e.db, cfg)
		e.waitAcked(t, id)
		stop() // the client has sent its acknowledgements when Run returns
		require.Equal(t, 1, e.effects(t, " WHERE message_id = $1", id), "redelivered and applied once")
		e.requireBrokerAcks(t, id, 1)
	})
}

// TestBrokerAttributeID: message_id {attribute: operation-id}: two publishes of one
// operation (two broker ids) apply once; a message without the attribute is dead-lettered
// once, deduplicated by its broker id. The Handler sees the broker's facts.
func TestBrokerAttributeID(t *testing.T) {
	t.Parallel()
	brokerDoors(t, brokerOptions{}, func(t *testing.T, e *brokerEnv) {
		name := "attribute-" + e.door
		cfg := e.config(name)
		cfg.MessageID = &pipeline.Field{Attribute: "operation-id"}
		var mu sync.Mutex
		var seen []consumer.Message
		cfg.Handler = func(_ context.Context, _ pgx.Tx, m consumer.Message) error {
			mu.Lock()
			seen = append(seen, m)
			mu.Unlock()
			return nil
		}
		op := map[string]string{"operation-id": "op-1"}
		ids := e.send(t, brokerMsg{body: `{"n":1}`, attributes: op}, brokerMsg{body: `{"n":1}`, attributes: op}, brokerMsg{body: `{"n":2}`})
		require.NotEqual(t, ids[0], ids[1], "a second publish is a new broker message")
		received := testutil.ToFloat64(metrics.Received.WithLabelValues(name, e.door))
		start(t, e.db, cfg)
		e.waitAcked(t, ids...)

		require.Equal(t, 1, e.effects(t, " WHERE message_id = 'op-1'"))
		require.Equal(t, 1, e.db.Count(t, "{schema}.processed_messages WHERE message_id = 'op-1' AND status = 'done'"))
		require.Equal(t, 1, e.db.Count(t, "{schema}.dead_letters WHERE pipeline = $1 AND message_id IS NULL AND door = $2 AND reason LIKE '%no message id%'", name, e.door))
		require.Equal(t, 1, e.db.Count(t, "{schema}.processed_messages WHERE message_id = $1 AND status = 'dead'", e.door+"-message:"+ids[2]))
		require.Equal(t, received+3, testutil.ToFloat64(metrics.Received.WithLabelValues(name, e.door)))
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, seen, 1)
		m := seen[0]
		require.Equal(t, e.door, m.Door)
		require.Equal(t, "op-1", m.ID)
		require.Contains(t, ids[:2], m.BrokerID)
		require.Equal(t, "op-1", m.Headers["operation-id"])
		require.False(t, m.Time.IsZero())
	})
}

// TestBrokerLaneOrder: the messages of each lane (ordering key, FIFO group) are applied in
// publish order while batches run concurrently and take their time, received by eight
// streaming pulls (Pub/Sub) or eight ReceiveMessage pollers (SQS).
func TestBrokerLaneOrder(t *testing.T) {
	t.Parallel()
	brokerDoors(t, brokerOptions{ordered: true}, func(t *testing.T, e *brokerEnv) {
		lanes := []string{"k0", "k1", "k2"}
		if e.door == consumer.DoorSQS && sqstest.Kind(t) == "goaws" {
			lanes = lanes[:1] // goaws keeps the order of one group per queue (docs/brokers.md)
		}
		const n = 12
		var msgs []brokerMsg
		for i := range n {
			for _, l := range lanes {
				msgs = append(msgs, brokerMsg{body: fmt.Sprintf(`{"lane":%q,"n":%d}`, l, i), lane: l})
			}
		}
		ids := e.send(t, msgs...)
		cfg := e.config("lanes")
		cfg.Effect.SQL, cfg.BatchSize, cfg.BatchesInFlight, cfg.Receivers = "", 3, 4, 8
		cfg.Handler = func(ctx context.Context, tx pgx.Tx, m consumer.Message) error {
			time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
			_, err := tx.Exec(ctx, e.db.Q(`INSERT INTO {schema}.effects (message_id, payload, lane) VALUES ($1, $2, $3)`), m.ID, m.Value, string(m.Key))
			return err
		}
		start(t, e.db, cfg)
		e.waitAcked(t, ids...)
		for _, l := range lanes {
			got := e.db.Text(t, `SELECT string_agg(payload->>'n', ',' ORDER BY seq) FROM {schema}.effects WHERE payload->>'lane' = $1`, l)
			want := make([]string, n)
			for i := range want {
				want[i] = fmt.Sprint(i)
			}
			require.Equal(t, strings.Join(want, ","), got, "lane %s", l)
		}
		require.Equal(t, n*len(lanes), e.effects(t, ""))
	})
}

// TestBrokerLeaseOfALongBatch: a batch that takes several times the lease is not
// redelivered meanwhile: its lease is extended (SQS visibility of 2 s, Pub/Sub ack deadline
// of 6 s on a subscription of 1 s).
func TestBrokerLeaseOfALongBatch(t *testing.T) {
	t.Parallel()
	brokerDoors(t, brokerOptions{ackDeadline: time.Second}, func(t *testing.T, e *brokerEnv) {
		cfg := e.config("lease")
		hold := 5 * time.Second
		cfg.Lease = 2 * time.Second
		if e.door == consumer.DoorPubSub {
			cfg.Lease, hold = 6*time.Second, 9*time.Second
		}
		var calls, committed atomic.Int64
		cfg.Effect.SQL = ""
		cfg.Handler = func(context.Context, pgx.Tx, consumer.Message) error {
			calls.Add(1)
			time.Sleep(hold)
			return nil
		}
		cfg.AfterCommit = func(batch []consumer.Message) { committed.Add(int64(len(batch))) }
		id := e.send(t, brokerMsg{body: `{"id":"long"}`})[0]
		stop := start(t, e.db, cfg)
		e.waitAcked(t, id)
		stop()
		require.Equal(t, int64(1), calls.Load())
		require.Equal(t, int64(1), committed.Load(), "received once: a redelivery would have committed as a duplicate")
		e.requireBrokerAcks(t, id, 1)
	})
}

// TestSQSBatchesFill: while every batch slot is taken, what the pollers receive waits for
// the next batch, which takes it whole (up to BatchSize), rather than a batch cut on the
// linger from the first answer: here two answers of ten received while the only slot is
// held make one batch of twenty.
func TestSQSBatchesFill(t *testing.T) {
	t.Parallel()
	e := newSQSEnv(t, brokerOptions{})
	const name = "batches-fill"
	cfg := e.config(name)
	cfg.Effect.SQL, cfg.BatchSize, cfg.BatchesInFlight, cfg.Receivers = "", 20, 1, 2
	cfg.Lease = 2 * time.Second // an answer goaws loses comes back soon (BENCHMARKS.md)
	blocked, unblock := make(chan struct{}), make(chan struct{})
	var first sync.Once
	cfg.Handler = func(ctx context.Context, tx pgx.Tx, m consumer.Message) error {
		first.Do(func() {
			close(blocked)
			<-unblock
		})
		_, err := tx.Exec(ctx, e.db.Q(`INSERT INTO {schema}.effects (message_id) VALUES ($1)`), m.ID)
		return err
	}
	var mu sync.Mutex
	var sizes []int
	onAck := cfg.OnAck
	cfg.OnAck = func(batch []consumer.Message) {
		mu.Lock()
		sizes = append(sizes, len(batch))
		mu.Unlock()
		onAck(batch)
	}
	received := func() int { return int(testutil.ToFloat64(metrics.Received.WithLabelValues(name, consumer.DoorSQS))) }
	waitReceived := func(n int) {
		t.Helper()
		require.Eventually(t, func() bool { return received() >= n }, 60*time.Second, 5*time.Millisecond)
	}
	ids := e.send(t, brokerMsg{body: `{"n":0}`})
	start(t, e.db, cfg)
	<-blocked // the first batch, of one message, holds the only slot
	for n := range 2 {
		var msgs []brokerMsg
		for i := range 10 {
			msgs = append(msgs, brokerMsg{body: fmt.Sprintf(`{"n":%d}`, 1+10*n+i)})
		}
		ids = append(ids, e.send(t, msgs...)...)
		waitReceived(1 + 10*(n+1))
	}
	close(unblock)
	e.waitAcked(t, ids...)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []int{1, 20}, sizes, "the second batch is both answers received meanwhile")
	require.Equal(t, 21, e.effects(t, ""))
}

// TestSQSBacklog: an SQS subscription reports its queue's messages not yet deleted (visible
// and in flight), and exports them while it runs; Pub/Sub reports none.
func TestSQSBacklog(t *testing.T) {
	t.Parallel()
	e := newSQSEnv(t, brokerOptions{})
	ids := e.send(t, brokerMsg{body: `{"id":"a"}`}, brokerMsg{body: `{"id":"b"}`}, brokerMsg{body: `{"id":"c"}`})
	cfg := e.config("backlog")
	cfg.BacklogInterval = 50 * time.Millisecond
	c, err := consumer.New(e.db.Pool, cfg)
	require.NoError(t, err)
	ctx := context.Background()
	n, err := c.Backlog(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(3), n)
	// A received message is not deleted: still in the backlog, in flight.
	require.Len(t, sqstest.Receive(t, e.queue, 1, time.Second, 2*time.Second), 1)
	n, err = c.Backlog(ctx)
	require.NoError(t, err)
	if sqstest.Kind(t) == "goaws" {
		// goaws counts it in ApproximateNumberOfMessages as well (docs/brokers.md).
		require.Equal(t, int64(4), n)
	} else {
		require.Equal(t, int64(3), n)
	}

	// The gauge follows while the consumer runs, down to 0 once all is deleted.
	start(t, e.db, cfg)
	e.waitAcked(t, ids...)
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(metrics.SubscriptionBacklog.WithLabelValues("backlog")) == 0
	}, 10*time.Second, 50*time.Millisecond)
	n, err = c.Backlog(ctx)
	require.NoError(t, err)
	require.Zero(t, n)

	p := newPubSubEnv(t, brokerOptions{})
	pc, err := consumer.New(p.db.Pool, p.config("backlog-pubsub"))
	require.NoError(t, err)
	_, err = pc.Backlog(ctx)
	require.ErrorIs(t, err, consumer.ErrBacklogUnknown)
}

// TestBrokerTrace: each message gets a consumer span continuing its traceparent attribute,
// with the messaging conventions' system and destination; no payload or attribute is
// recorded.
func TestBrokerTrace(t *testing.T) {
	t.Parallel()
	brokerDoors(t, brokerOptions{}, func(t *testing.T, e *brokerEnv) {
		const parent = "00-11111111111111111111111111111111-1111111111111111-01"
		provider, exporter := tracing.InMemory()
		cfg := e.config("trace")
		cfg.TracerProvider = provider
		ids := e.send(t, brokerMsg{body: `{"id":"t1","card":"4242-secret"}`, attributes: map[string]string{"traceparent": parent, "secret-attr": "s3cret"}})
		start(t, e.db, cfg)
		e.waitAcked(t, ids...)
		var found bool
		for _, s := range exporter.GetSpans() {
			if s.SpanKind != trace.SpanKindConsumer {
				continue
			}
			found = true
			require.Equal(t, "11111111111111111111111111111111", s.SpanContext.TraceID().String())
			attrs := map[attribute.Key]string{}
			for _, a := range s.Attributes {
				attrs[a.Key] = a.Value.String()
				require.NotContains(t, a.Value.String(), "secret")
				require.NotContains(t, a.Value.String(), "s3cret")
			}
			system := map[string]string{consumer.DoorPubSub: "gcp_pubsub", consumer.DoorSQS: "aws_sqs"}[e.door]
			require.Equal(t, system, attrs["messaging.system"])
			require.Equal(t, ids[0], attrs["messaging.message.id"])
			require.NotEmpty(t, attrs["messaging.destination.name"])
			require.Equal(t, "process "+attrs["messaging.destination.name"], s.Name)
		}
		require.True(t, found, "a consumer span")
	})
}

// TestBrokerConfig: New takes exactly one source, and each door's own fields.
func TestBrokerConfig(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	for _, tc := range []struct {
		name string
		cfg  consumer.Config
		door string
		err  string
	}{
		{"kafka", consumer.Config{Topics: []string{"t"}}, "kafka", ""},
		{"pubsub", consumer.Config{PubSub: &consumer.PubSub{Subscription: "s"}}, "pubsub", ""},
		{"pubsub full name", consumer.Config{PubSub: &consumer.PubSub{Subscription: "projects/p/subscriptions/s"}}, "pubsub", ""},
		{"sqs", consumer.Config{SQS: &consumer.SQS{Queue: "q.fifo"}, MessageID: &pipeline.Field{Attribute: "operation-id"}}, "sqs", ""},
		{"negative receivers", consumer.Config{SQS: &consumer.SQS{Queue: "q"}, Receivers: -1}, "sqs", "Receivers must be positive"},
		{"none", consumer.Config{}, "kafka", "one of Topics, PubSub and SQS is required"},
		{"two", consumer.Config{Topics: []string{"t"}, SQS: &consumer.SQS{Queue: "q"}}, "sqs", "exclusive"},
		{"group on pubsub", consumer.Config{PubSub: &consumer.PubSub{Subscription: "s"}, Group: "g"}, "pubsub", "Group is for Kafka"},
		{"empty subscription", consumer.Config{PubSub: &consumer.PubSub{}}, "pubsub", "PubSub: subscription: required"},
		{"bad name", consumer.Config{PubSub: &consumer.PubSub{Subscription: "projects/p/topics/s"}}, "pubsub", "PubSub: subscription:"},
		{"project and full name", consumer.Config{PubSub: &consumer.PubSub{Subscription: "projects/p/subscriptions/s", Project: "p"}}, "pubsub", "PubSub: project:"},
		{"empty queue", consumer.Config{SQS: &consumer.SQS{}}, "sqs", "SQS.Queue is required"},
		{"header on sqs", consumer.Config{SQS: &consumer.SQS{Queue: "q"}, MessageID: &pipeline.Field{Header: "operation-id"}}, "sqs", "MessageID: header: Pub/Sub and SQS messages have attributes"},
		{"attribute on kafka", consumer.Config{Topics: []string{"t"}, MessageID: &pipeline.Field{Attribute: "operation-id"}}, "kafka", "MessageID: attribute: only Pub/Sub and SQS"},
		{"header in a composite on pubsub", consumer.Config{PubSub: &consumer.PubSub{Subscription: "s"}, MessageID: &pipeline.Field{Parts: []pipeline.Field{{JSON: "/a"}, {Header: "h"}}}}, "pubsub", "[1]: header"},
		{"order by attribute", consumer.Config{SQS: &consumer.SQS{Queue: "q"}, Order: &pipeline.Order{Entity: pipeline.Field{Attribute: "e"}, Version: pipeline.Field{JSON: "/v"}}}, "sqs", ""},
		{"publish key by header on sqs", consumer.Config{SQS: &consumer.SQS{Queue: "q"}, Publish: pipeline.Targets{{Topic: "o", Key: &pipeline.Field{Header: "k"}}}}, "sqs", "Publish[0]: key: header: Pub/Sub and SQS messages have attributes"},
		{"publish key by attribute on pubsub", consumer.Config{PubSub: &consumer.PubSub{Subscription: "s"}, Publish: pipeline.Targets{{Topic: "o", Key: &pipeline.Field{Attribute: "k"}}}}, "pubsub", ""},
		{"publish key by attribute on kafka", consumer.Config{Topics: []string{"t"}, Publish: pipeline.Targets{{Topic: "o", Key: &pipeline.Field{Attribute: "k"}}}}, "kafka", "Publish[0]: key: attribute: only Pub/Sub and SQS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Name = "p"
			require.Equal(t, tc.door, cfg.Door())
			c, err := consumer.New(db.Pool, &cfg)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.door == "kafka", c.Config().Group != "", "a group for Kafka only")
			if tc.door != "kafka" {
				err := c.Run(context.Background())
				require.ErrorContains(t, err, "Client is required")
			}
		})
	}
}

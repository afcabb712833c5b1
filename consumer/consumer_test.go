package consumer_test

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/consumer"
	"github.com/idemd/idemd/internal/kafkatest"
	"github.com/idemd/idemd/internal/pgtest"
)

// bundle is one test's world: a schema with an effects table, a topic and a group.
type bundle struct {
	db         *pgtest.DB
	brokers    []string
	topic      string
	group      string
	partitions int
	commits    *kafkatest.CommitLog
	watchOnce  sync.Once
	watch      *pgtest.Watcher
}

// waitCommitted returns once cond holds for the committed offsets (one per partition, -1
// when none), checked after each commit of the test's consumers.
func (b *bundle) waitCommitted(t testing.TB, timeout time.Duration, cond func(offs []int64) bool) {
	t.Helper()
	b.commits.Wait(t, timeout, b.partitions, cond)
}

// effectSQL records every run of the effect; the table has no unique key, so a repeated
// effect shows as a second row.
const effectSQL = `INSERT INTO {schema}.effects (message_id, payload, topic, part, off)
VALUES (@message_id, @payload::jsonb, @topic, @partition, @offset)`

func setup(t testing.TB, partitions int) *bundle {
	t.Helper()
	b := &bundle{
		db:      pgtest.NewWithOptions(t, pgtest.Options{MaxConns: 6}),
		brokers: kafkatest.Brokers(t),
		topic:   kafkatest.Topic(t, partitions),
		group:   kafkatest.Group(t),

		partitions: partitions,
		commits:    kafkatest.NewCommitLog(),
	}
	b.db.Exec(t, b.db.Q(`CREATE TABLE {schema}.effects (
    message_id text NOT NULL, payload jsonb, topic text, part int, off bigint)`))
	return b
}

func testLogger() *logrus.Entry {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return logrus.NewEntry(l)
}

// config is a consumer of the bundle's topic with the recording SQL effect and group
// timings short enough for tests.
func (b *bundle) config() *consumer.Config {
	return &consumer.Config{
		Name:              "ledger",
		Brokers:           b.brokers,
		Topics:            []string{b.topic},
		Group:             b.group,
		Schema:            b.db.Schema,
		Effect:            consumer.Effect{SQL: b.db.Q(effectSQL)},
		BatchSize:         100,
		HeartbeatInterval: 100 * time.Millisecond,
		SessionTimeout:    6 * time.Second,
		RebalanceTimeout:  5 * time.Second,
		BackoffMin:        5 * time.Millisecond,
		BackoffMax:        50 * time.Millisecond,
		Logger:            testLogger(),
		OnOffsetCommit:    b.commits.Record,
	}
}

// start runs a consumer until the returned stop is called (or the test ends).
func start(t testing.TB, db *pgtest.DB, cfg *consumer.Config) (stop func()) {
	t.Helper()
	c, err := consumer.New(db.Pool, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Errorf("consumer did not stop")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// msg is a JSON record with an operation-id header, bound for partition p.
func msg(id string, p int, body string) kafka.Message {
	if body == "" {
		body = fmt.Sprintf(`{"id":%q}`, id)
	}
	return kafka.Message{
		Partition: p,
		Headers:   []kafka.Header{{Key: "operation-id", Value: []byte(id)}},
		Value:     []byte(body),
	}
}

// perPartition is counts[p] records for each partition p, with the ids p0-0, p0-1… p1-0…
func perPartition(counts ...int) []kafka.Message {
	var msgs []kafka.Message
	for p, n := range counts {
		for i := range n {
			msgs = append(msgs, msg(fmt.Sprintf("p%d-%d", p, i), p, ""))
		}
	}
	return msgs
}

// produce writes msgs, each to the partition it names.
func produce(t testing.TB, brokers []string, topic string, msgs ...kafka.Message) {
	t.Helper()
	require.NoError(t, write(brokers, topic, msgs))
}

// produceAsync is produce in the background; the test fails at cleanup if it did.
func produceAsync(t testing.TB, brokers []string, topic string, msgs ...kafka.Message) {
	done := make(chan error, 1)
	go func() { done <- write(brokers, topic, msgs) }()
	t.Cleanup(func() {
		if err := <-done; err != nil {
			t.Errorf("producing: %v", err)
		}
	})
}

func write(brokers []string, topic string, msgs []kafka.Message) error {
	w := &kafka.Writer{
		Addr:  kafka.TCP(brokers...),
		Topic: topic,
		Balancer: kafka.BalancerFunc(func(m kafka.Message, partitions ...int) int {
			return m.Partition
		}),
		BatchSize:    1000,
		BatchTimeout: time.Millisecond,
		RequiredAcks: kafka.RequireAll,
	}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for len(msgs) > 0 {
		n := min(len(msgs), 1000)
		out := make([]kafka.Message, n)
		copy(out, msgs[:n])
		if err := w.WriteMessages(ctx, out...); err != nil {
			return err
		}
		msgs = msgs[n:]
	}
	return nil
}

// until returns once cond holds, checking it again after each commit that changed the
// test's effects or outbox tables (pgtest.Watch), not on a timer.
func (b *bundle) until(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	b.watchOnce.Do(func() { b.watch = pgtest.Watch(t, b.db.Q("{schema}.effects"), b.db.Q("{schema}.outbox")) })
	b.watch.Until(t, timeout, what, cond)
}

func (b *bundle) effects(t testing.TB) int { return b.db.Count(t, "{schema}.effects") }

func (b *bundle) distinctEffects(t testing.TB) int {
	return b.db.Count(t, "(SELECT DISTINCT message_id FROM {schema}.effects) d")
}

// processedCount counts the ids of the "ledger" pipeline that reached a final state.
func (b *bundle) processedCount(t testing.TB) int {
	return b.db.Count(t, "{schema}.processed_messages WHERE scope = 'ledger'")
}

// committed returns the group's committed offset of each partition of topic (-1: none).
func committed(t testing.TB, brokers []string, group, topic string, partitions int) []int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ps := make([]int, partitions)
	for i := range ps {
		ps[i] = i
	}
	cl := &kafka.Client{Addr: kafka.TCP(brokers...)}
	resp, err := cl.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ps}})
	require.NoError(t, err)
	out := make([]int64, partitions)
	for i := range out {
		out[i] = -1
	}
	for _, p := range resp.Topics[topic] {
		out[p.Partition] = p.CommittedOffset
	}
	return out
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = prefix + strconv.Itoa(i)
	}
	return out
}

func TestDuplicatesInOneBatch(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	var msgs []kafka.Message
	for _, id := range ids("a", 20) {
		// Each id three times, back to back: they land in one batch.
		msgs = append(msgs, msg(id, 0, ""), msg(id, 0, ""), msg(id, 0, ""))
	}
	produce(t, b.brokers, b.topic, msgs...)
	start(t, b.db, b.config())

	b.waitCommitted(t, 30*time.Second, func(offs []int64) bool {
		return offs[0] == 60
	})
	require.Equal(t, 20, b.effects(t))
	require.Equal(t, 20, b.distinctEffects(t))
	require.Equal(t, 20, b.processedCount(t))
}

func TestDuplicatesAcrossBatches(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	cfg := b.config()
	cfg.BatchSize = 7
	var msgs []kafka.Message
	for round := 0; round < 3; round++ {
		for _, id := range ids("a", 30) {
			msgs = append(msgs, msg(id, 0, ""))
		}
	}
	produce(t, b.brokers, b.topic, msgs...)
	start(t, b.db, cfg)

	b.waitCommitted(t, 30*time.Second, func(offs []int64) bool {
		return offs[0] == 90
	})
	require.Equal(t, 30, b.effects(t))
	require.Equal(t, 30, b.distinctEffects(t))
}

func TestDuplicatesAcrossPartitions(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	var msgs []kafka.Message
	for _, id := range ids("a", 200) {
		// The same id on both partitions: two batches, two transactions, in parallel.
		msgs = append(msgs, msg(id, 0, ""), msg(id, 1, ""))
	}
	produce(t, b.brokers, b.topic, msgs...)
	start(t, b.db, b.config())

	b.waitCommitted(t, 30*time.Second, func(offs []int64) bool {
		c := offs
		return c[0] == 200 && c[1] == 200
	})
	require.Equal(t, 200, b.effects(t))
	require.Equal(t, 200, b.distinctEffects(t))
}

// TestBatchesSpanPartitions: one worker reads three partitions, so its transactions hold
// records of several partitions (one transaction id on the effect rows of several
// partitions); each partition's records are still applied in order, an id repeated across
// partitions is applied once, and every partition's offset is committed to its end.
func TestBatchesSpanPartitions(t *testing.T) {
	t.Parallel()
	b := setup(t, 3)
	b.db.Exec(t, b.db.Q(`ALTER TABLE {schema}.effects ADD COLUMN seq bigserial`))
	var msgs []kafka.Message
	for i, id := range ids("a", 300) {
		msgs = append(msgs, msg(id, i%3, ""))
		if i%10 == 0 { // an id seen again on the next partition
			msgs = append(msgs, msg(id, (i+1)%3, ""))
		}
	}
	produce(t, b.brokers, b.topic, msgs...)
	cfg := b.config()
	cfg.BatchesInFlight = 1
	cfg.Linger = 100 * time.Millisecond
	start(t, b.db, cfg)

	want := make([]int64, 3)
	for _, m := range msgs {
		want[m.Partition]++
	}
	b.waitCommitted(t, 30*time.Second, func(offs []int64) bool {
		return offs[0] == want[0] && offs[1] == want[1] && offs[2] == want[2]
	})
	require.Equal(t, 300, b.effects(t))
	require.Equal(t, 300, b.distinctEffects(t))
	spanning := b.db.Count(t, `(SELECT xmin::text FROM {schema}.effects GROUP BY 1
HAVING count(DISTINCT part) > 1) x`)
	require.Positive(t, spanning, "no transaction held records of more than one partition")
	outOfOrder := b.db.Count(t, `(SELECT 1 FROM (SELECT part, off,
    lag(off) OVER (PARTITION BY part ORDER BY seq) AS prev FROM {schema}.effects) e
WHERE off < prev) x`)
	require.Zero(t, outOfOrder, "a partition's records applied out of order")
}

// TestBatchesInFlightBoundsKafkaWorkers: with two workers for four partitions, a
// transaction holds records of the two partitions of its worker, never of the other's.
func TestBatchesInFlightBoundsKafkaWorkers(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	var msgs []kafka.Message
	for i, id := range ids("a", 400) {
		msgs = append(msgs, msg(id, i%4, ""))
	}
	produce(t, b.brokers, b.topic, msgs...)
	cfg := b.config()
	cfg.BatchesInFlight = 2
	// Room for both of a worker's partitions in a batch, and time for them to arrive.
	cfg.BatchSize, cfg.Linger = 1000, 100*time.Millisecond
	start(t, b.db, cfg)

	b.waitCommitted(t, 30*time.Second, func(offs []int64) bool {
		return offs[0] == 100 && offs[1] == 100 && offs[2] == 100 && offs[3] == 100
	})
	require.Equal(t, 400, b.distinctEffects(t))
	// Partitions are dealt in turn: 0 and 2 to one worker, 1 and 3 to the other.
	mixed := b.db.Count(t, `(SELECT xmin::text FROM {schema}.effects GROUP BY 1
HAVING count(DISTINCT part % 2) > 1 OR count(DISTINCT part) > 2) x`)
	require.Zero(t, mixed, "a transaction held records of both workers' partitions")
	spanning := b.db.Count(t, `(SELECT xmin::text FROM {schema}.effects GROUP BY 1
HAVING count(DISTINCT part) > 1) x`)
	require.Positive(t, spanning, "no transaction held records of both of a worker's partitions")
}

package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idemd/idemd/internal/kafkatest"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/internal/proctest"
	"github.com/idemd/idemd/internal/testsignal"
	"github.com/idemd/idemd/outbox"
)

type relayBundle struct {
	db    *pgtest.DB
	store *outbox.Store
	topic string
}

func setupRelay(t *testing.T, partitions int, opts pgtest.Options) *relayBundle {
	t.Helper()
	db := pgtest.NewWithOptions(t, opts)
	return &relayBundle{db: db, store: outbox.New(&outbox.Config{Schema: db.Schema}), topic: kafkatest.Topic(t, partitions)}
}

func quietLogger() *logrus.Entry {
	l := logrus.New()
	l.SetLevel(logrus.ErrorLevel)
	return logrus.NewEntry(l)
}

// startRelay runs a relay until the test ends (or stop is called) and returns it. Its
// Leading signal is initialised, and so are the signals init initialises.
func (b *relayBundle) startRelay(t testing.TB, cfg outbox.RelayConfig, init ...func(*outbox.RelaySignals)) (r *outbox.Relay, stop func() error) {
	t.Helper()
	return b.startRelayOn(t, b.db.Pool, cfg, init...)
}

// startRelayOn is startRelay with the relay on pool.
func (b *relayBundle) startRelayOn(t testing.TB, pool *pgxpool.Pool, cfg outbox.RelayConfig, init ...func(*outbox.RelaySignals)) (r *outbox.Relay, stop func() error) {
	t.Helper()
	cfg.Schema = b.db.Schema
	if cfg.Brokers == nil && cfg.Writer == nil && cfg.PubSub == nil && cfg.SQS == nil {
		cfg.Brokers = kafkatest.Brokers(t)
	}
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	cfg.PollInterval = cmpOr(cfg.PollInterval, 200*time.Millisecond)
	// The floor moves as often as the relay can move it: every test of the relay runs
	// through it (late commits, rollbacks, crashes).
	cfg.FloorInterval = cmpOr(cfg.FloorInterval, time.Millisecond)
	r, err := outbox.NewRelay(pool, &cfg)
	require.NoError(t, err)
	r.TestSignals().Leading.Init(t)
	for _, f := range init {
		f(r.TestSignals())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop = func() error {
		once.Do(func() { cancel(); runErr = <-done })
		return runErr
	}
	t.Cleanup(func() { _ = stop() })
	return r, stop
}

func cmpOr(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

func (b *relayBundle) enqueue(t *testing.T, events ...outbox.Event) {
	t.Helper()
	ctx := context.Background()
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, b.store.EnqueueTx(ctx, tx, events...))
	require.NoError(t, tx.Commit(ctx))
}

func (b *relayBundle) events(n int, prefix string) []outbox.Event {
	out := make([]outbox.Event, n)
	for i := range out {
		out[i] = outbox.Event{Topic: b.topic, Key: []byte(fmt.Sprintf("key-%d", i%7)), Payload: []byte(fmt.Sprintf("%s-%d", prefix, i)),
			Pipeline: "p", CausationID: fmt.Sprintf("%s-%d", prefix, i)}
	}
	return out
}

// drain waits until r leads, then until every row committed so far is published
// (Relay.Drain), and checks that none is left.
func (b *relayBundle) drain(t testing.TB, r *outbox.Relay, timeout time.Duration) {
	t.Helper()
	r.TestSignals().Leading.Wait(t)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	require.NoError(t, r.Drain(ctx))
	require.Zero(t, b.db.Count(t, "{schema}.outbox WHERE published_at IS NULL"), "Drain returned with rows left")
}

// TestRelayPublishesEveryCommittedRow: 10,000 rows enqueued by concurrent transactions,
// some committing late and some rolling back. Every committed row is published, no
// rolled-back row is, and rows of one key written by sequential transactions keep their
// order.
func TestRelayPublishesEveryCommittedRow(t *testing.T) {
	t.Parallel()
	const writers = 12
	b := setupRelay(t, 4, pgtest.Options{MaxConns: writers + 2})
	relay, _ := b.startRelay(t, outbox.RelayConfig{BatchSize: 500})
	o := b.writeConcurrently(t, writers, 850, 5, func(_ int, batch *pgx.Batch, events []outbox.Event) (func(), error) {
		return nil, b.store.Queue(batch, events...)
	})
	require.GreaterOrEqual(t, len(o.committed)+len(o.rolledBack), 10000)
	require.NotEmpty(t, o.rolledBack)
	b.drain(t, relay, 60*time.Second)
	o.checkPublished(t, kafkatest.ReadAll(t, b.topic, len(o.committed), 60*time.Second))
}

// written is what concurrent writers committed and rolled back, by payload.
type written struct{ committed, rolledBack map[string]bool }

// writeConcurrently runs writers goroutines, each writing perWriter rows of its own key
// ("writer-N", payloads "writer-N:000123" in order) in transactions of 1 to maxPerTx rows:
// one in ten rolls back, one in eight commits late, while others commit rows with higher
// ids. queue queues a transaction's rows for writer w in batch, and returns what runs once
// it committed (nil: nothing).
func (b *relayBundle) writeConcurrently(t *testing.T, writers, perWriter, maxPerTx int,
	queue func(w int, batch *pgx.Batch, events []outbox.Event) (func(), error)) written {
	t.Helper()
	ctx := context.Background()
	var (
		mu sync.Mutex
		o  = written{committed: map[string]bool{}, rolledBack: map[string]bool{}}
		wg sync.WaitGroup
	)
	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			key := fmt.Sprintf("writer-%d", w)
			for seq, tx := 0, 0; seq < perWriter; tx++ {
				var (
					events   []outbox.Event
					payloads []string
				)
				for range 1 + rng.IntN(maxPerTx) {
					p := fmt.Sprintf("%s:%06d", key, seq)
					seq++
					payloads = append(payloads, p)
					events = append(events, outbox.Event{Topic: b.topic, Key: []byte(key), Payload: []byte(p), Pipeline: "p", CausationID: key + "-" + strconv.Itoa(tx)})
				}
				rollback, late := rng.IntN(10) == 0, rng.IntN(8) == 0
				t0, err := b.db.Pool.Begin(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				var batch pgx.Batch
				after, err := queue(w, &batch, events)
				if err == nil {
					err = t0.SendBatch(ctx, &batch).Close()
				}
				if err != nil {
					t.Error(err)
					return
				}
				if late {
					// Others commit rows with higher ids meanwhile; the relay must not skip ours.
					time.Sleep(time.Duration(10+rng.IntN(40)) * time.Millisecond)
				}
				if rollback {
					err = t0.Rollback(ctx)
				} else if err = t0.Commit(ctx); err == nil && after != nil {
					after()
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				for _, p := range payloads {
					if rollback {
						o.rolledBack[p] = true
					} else {
						o.committed[p] = true
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.False(t, t.Failed())
	return o
}

// checkPublished checks records: every committed row is there, no rolled-back one, and
// each writer's rows are in order (judged on first appearances: a repeat is at-least-once).
func (o written) checkPublished(t *testing.T, records []kafka.Message) {
	t.Helper()
	seen := map[string]bool{}
	lastSeq := map[string]int{}
	for _, m := range records {
		p := string(m.Value)
		require.False(t, o.rolledBack[p], "rolled-back row %s was published", p)
		require.True(t, o.committed[p], "unknown record %s", p)
		require.NotEmpty(t, kafkatest.Header(m, outbox.HeaderOperationID))
		require.Equal(t, "p", kafkatest.Header(m, outbox.HeaderPipeline))
		key, seqText, _ := strings.Cut(p, ":")
		// Each record's headers are its row's (a round's records share their arrays).
		require.True(t, strings.HasPrefix(kafkatest.Header(m, outbox.HeaderCausationID), key+"-"),
			"record %s has causation-id %q", p, kafkatest.Header(m, outbox.HeaderCausationID))
		if seen[p] {
			continue
		}
		seen[p] = true
		seq, _ := strconv.Atoi(seqText)
		if last, ok := lastSeq[key]; ok {
			require.Greater(t, seq, last, "key %s out of order", key)
		}
		lastSeq[key] = seq
	}
	require.Len(t, seen, len(o.committed), "every committed row is published")
}

// TestRelayCrashBetweenPublishAndMark: the relay dies after Kafka acknowledged a batch and
// before it marked the rows. The next relay publishes them again with the same
// operation-id; nothing is lost.
func TestRelayCrashBetweenPublishAndMark(t *testing.T) {
	t.Parallel()
	b := setupRelay(t, 2, pgtest.Options{})
	b.enqueue(t, b.events(100, "crash")...)

	crashed := errors.New("simulated crash after publish")
	hit := make(chan struct{})
	first, stop := b.startRelay(t, outbox.RelayConfig{BatchSize: 30, AfterPublish: func([]int64) error {
		close(hit)
		return crashed
	}})
	select {
	case <-hit:
	case <-time.After(30 * time.Second):
		t.Fatal("the relay never published")
	}
	require.ErrorIs(t, stop(), crashed)
	require.Zero(t, first.Published())
	require.Equal(t, 100, b.db.Count(t, "{schema}.outbox WHERE published_at IS NULL"), "nothing was marked")

	second, _ := b.startRelay(t, outbox.RelayConfig{BatchSize: 30})
	b.drain(t, second, 30*time.Second)

	records := kafkatest.ReadAll(t, b.topic, 130, 30*time.Second)
	require.Len(t, records, 130, "the first batch of 30 twice, then the other 70")
	require.Len(t, sameOperationIDs(t, records), 100)
}

// sameOperationIDs checks that the records of one payload (one row, published more than
// once) carry the same operation-id, and returns them by payload.
func sameOperationIDs(t *testing.T, records []kafka.Message) map[string]string {
	t.Helper()
	ops := map[string]string{}
	for _, m := range records {
		op := kafkatest.Header(m, outbox.HeaderOperationID)
		if prev, ok := ops[string(m.Value)]; ok {
			require.Equal(t, prev, op, "a re-published record carries the same operation-id")
		}
		ops[string(m.Value)] = op
	}
	return ops
}

// TestRelayLeadership: of two relays only one publishes; when it stops, the standby takes
// over and publishes the rest.
func TestRelayLeadership(t *testing.T) {
	t.Parallel()
	b := setupRelay(t, 1, pgtest.Options{})
	cfg := outbox.RelayConfig{StandbyPoll: 100 * time.Millisecond}
	a, stopA := b.startRelay(t, cfg)
	c, stopC := b.startRelay(t, cfg)
	leader, standby, stopLeader := a, c, stopA
	select {
	case <-a.TestSignals().Leading.C():
	case <-c.TestSignals().Leading.C():
		leader, standby, stopLeader = c, a, stopC
	case <-time.After(testsignal.WaitTimeout):
		t.Fatal("no relay took the leadership")
	}
	require.True(t, leader.IsLeader())
	require.False(t, standby.IsLeader())
	require.ErrorIs(t, standby.Drain(context.Background()), outbox.ErrNotLeader, "a standby has nothing to drain")

	b.enqueue(t, b.events(50, "first")...)
	require.NoError(t, leader.Drain(context.Background()))
	require.EqualValues(t, 50, leader.Published())
	require.Zero(t, standby.Published())

	require.NoError(t, stopLeader())
	b.enqueue(t, b.events(50, "second")...)
	b.drain(t, standby, 20*time.Second)
	require.EqualValues(t, 50, standby.Published())
	require.Len(t, kafkatest.ReadAll(t, b.topic, 100, 20*time.Second), 100)
}

// TestRelayBrokerOutage: with the broker unreachable, rows accumulate and nothing is lost;
// when it comes back, all of them drain.
func TestRelayBrokerOutage(t *testing.T) {
	t.Parallel()
	// This test owns its broker: it has to stop and start it.
	addr := proctest.FreeAddr(t)
	_, ps, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	port, err := strconv.Atoi(ps)
	require.NoError(t, err)

	b := &relayBundle{db: pgtest.New(t), topic: "outage"}
	b.store = outbox.New(&outbox.Config{Schema: b.db.Schema})
	b.enqueue(t, b.events(200, "outage")...)

	relay, _ := b.startRelay(t, outbox.RelayConfig{Brokers: []string{addr}, BackoffMin: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond},
		func(s *outbox.RelaySignals) { s.Round.Init(t) })
	for range 3 {
		rd := relay.TestSignals().Round.WaitFor(t, "a failed round", func(rd outbox.RelayRound) bool { return len(rd.Failed) > 0 })
		require.Zero(t, rd.Published+rd.DeadLettered, "an outage publishes and dead-letters nothing")
	}
	require.Equal(t, 200, b.db.Count(t, "{schema}.outbox WHERE published_at IS NULL"), "every row is kept during the outage")
	require.Zero(t, b.db.Count(t, "{schema}.dead_letters"), "an outage never dead-letters")

	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(port))
	require.NoError(t, err)
	t.Cleanup(cluster.Close)
	kafkatest.CreateTopicOn(t, []string{addr}, b.topic, 2)

	b.drain(t, relay, 60*time.Second)
	got := kafkatest.ReadAllFrom(t, []string{addr}, b.topic, 200, 30*time.Second)
	require.GreaterOrEqual(t, len(got), 200, "every row reached the broker after the outage")
}

func TestPrunePublished(t *testing.T) {
	t.Parallel()
	b := setupRelay(t, 1, pgtest.Options{})
	b.enqueue(t, b.events(25, "prune")...)
	// 20 of them published (moved, as KeepPublished does) two hours ago, 3 a minute ago.
	b.db.Exec(t, b.db.Q(`WITH moved AS (DELETE FROM {schema}.outbox WHERE id IN (SELECT id FROM {schema}.outbox ORDER BY id LIMIT 23) RETURNING *)
INSERT INTO {schema}.outbox_published (id, operation_id, pipeline, causation_id, topic, key, payload, headers, created_at, published_at)
SELECT id, operation_id, pipeline, causation_id, topic, key, payload, headers, created_at,
    CASE WHEN row_number() OVER (ORDER BY id) <= 20 THEN now() - interval '2 hours' ELSE now() - interval '1 minute' END FROM moved`))
	n, err := b.store.PrunePublished(context.Background(), b.db.Pool, time.Hour, 7)
	require.NoError(t, err)
	require.EqualValues(t, 20, n)
	require.Equal(t, 2, b.db.Count(t, "{schema}.outbox"), "unpublished rows are never pruned")
	require.Equal(t, 3, b.db.Count(t, "{schema}.outbox_published"), "published rows within the retention stay")
}

// TestRelayBacklogOfLargeRows: a backlog whose round would exceed the broker's largest
// record batch (message.max.bytes, 1 MB by default) is published in smaller rounds, in
// order, instead of being refused by Kafka on every retry.
func TestRelayBacklogOfLargeRows(t *testing.T) {
	b := setupRelay(t, 1, pgtest.Options{})
	payload := `{"x":"` + strings.Repeat("a", 4000) + `"}`
	events := make([]outbox.Event, 600) // 2.4 MB, one partition
	for i := range events {
		events[i] = outbox.Event{Topic: b.topic, Key: []byte("k"), Payload: []byte(payload),
			Pipeline: "p", CausationID: strconv.Itoa(i)}
	}
	b.enqueue(t, events...)
	relay, _ := b.startRelay(t, outbox.RelayConfig{})
	b.drain(t, relay, 15*time.Second)
	got := kafkatest.ReadAll(t, b.topic, len(events), 15*time.Second)
	require.Len(t, got, len(events))
	for i, m := range got {
		require.Equal(t, strconv.Itoa(i), kafkatest.Header(m, outbox.HeaderCausationID))
	}
}

// TestRelayDeadLettersARecordTooLargeForTheBroker: a row Kafka will never accept does not stop
// the outbox: it is moved to dead_letters and the rows after it are published, in order.
func TestRelayDeadLettersARecordTooLargeForTheBroker(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	b := &relayBundle{db: db, store: outbox.New(&outbox.Config{Schema: db.Schema}), topic: kafkatest.Name(t, "small")}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl := &kafka.Client{Addr: kafka.TCP(kafkatest.Brokers(t)...)}
	resp, err := cl.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: b.topic, NumPartitions: 1, ReplicationFactor: 1,
		ConfigEntries: []kafka.ConfigEntry{{ConfigName: "max.message.bytes", ConfigValue: "20000"}},
	}}})
	require.NoError(t, err)
	require.NoError(t, resp.Errors[b.topic])

	events := b.events(3, "size")
	events[1].Payload = make([]byte, 50000) // over the topic's limit
	b.enqueue(t, events...)
	relay, _ := b.startRelay(t, outbox.RelayConfig{})
	b.drain(t, relay, 30*time.Second) // the rows after the oversize one are published

	require.Zero(t, b.db.Count(t, "{schema}.outbox"), "the two published rows are deleted, the refused one moved")
	require.Equal(t, 1, b.db.Count(t, "{schema}.dead_letters WHERE scope = $1 AND message_id = 'size-1'", "kafka:"+b.topic))
	records := kafkatest.ReadAll(t, b.topic, 2, 10*time.Second)
	require.Len(t, records, 2)
	require.Equal(t, "size-0", string(records[0].Value))
	require.Equal(t, "size-2", string(records[1].Value))
}

// TestRelayDrain: Drain returns once every row committed before the call is published, at
// once rather than at the next poll: these rows are inserted without the NOTIFY EnqueueTx
// sends, under a poll interval of an hour, so only Drain's wake-up publishes them.
func TestRelayDrain(t *testing.T) {
	t.Parallel()
	b := setupRelay(t, 2, pgtest.Options{})
	relay, stop := b.startRelay(t, outbox.RelayConfig{PollInterval: time.Hour})
	relay.TestSignals().Leading.Wait(t)
	b.db.Exec(t, b.db.Q(`INSERT INTO {schema}.outbox (operation_id, pipeline, causation_id, topic, key, payload)
SELECT gen_random_uuid(), 'p', 'quiet-' || i, $1, 'k', convert_to('quiet-' || i, 'UTF8') FROM generate_series(1, 40) i`), b.topic)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, relay.Drain(ctx))
	require.Zero(t, b.db.Count(t, "{schema}.outbox WHERE published_at IS NULL"))
	require.EqualValues(t, 40, relay.Published())
	require.NoError(t, relay.Drain(ctx), "an empty outbox drains at once")

	require.NoError(t, stop())
	require.ErrorIs(t, relay.Drain(ctx), outbox.ErrNotLeader, "a stopped relay leads nothing")
}

// TestRelayReadAheadKeepsAKeysOrder: a read ahead starts after the last id of the round
// being published. A transaction that took a lower id and committed late, followed by a
// transaction of the same key, must not have the second's row published first (SPEC 3:
// rows of one key written by transactions that ran one after another are published in
// that order).
func TestRelayReadAheadKeepsAKeysOrder(t *testing.T) {
	t.Parallel()
	b := setupRelay(t, 1, pgtest.Options{})
	ctx := context.Background()
	row := func(payload string) outbox.Event {
		return outbox.Event{Topic: b.topic, Key: []byte("k"), Payload: []byte(payload), Pipeline: "p", CausationID: payload}
	}
	first, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = first.Rollback(ctx) }()
	require.NoError(t, b.store.EnqueueTx(ctx, first, row("k-1")))
	b.enqueue(t, b.events(25, "other")...) // a full round of 10 past k-1's id, and more

	var once sync.Once
	relay, _ := b.startRelay(t, outbox.RelayConfig{BatchSize: 10}, func(s *outbox.RelaySignals) {
		s.ReadingAhead = func() {
			once.Do(func() {
				// The first round read past k-1 while its transaction ran; it commits now,
				// and the key's next row after it, before the next round is read ahead.
				if err := first.Commit(ctx); err != nil {
					t.Error(err)
				}
				b.enqueue(t, row("k-2"))
			})
		}
	})
	b.drain(t, relay, 30*time.Second)
	require.EqualValues(t, 1, relay.AheadsDropped(), "the rows read ahead, k-2 among them, were dropped")
	var order []string
	for _, m := range kafkatest.ReadAll(t, b.topic, 27, 30*time.Second) {
		if string(m.Key) == "k" && !slices.Contains(order, string(m.Value)) {
			order = append(order, string(m.Value))
		}
	}
	require.Equal(t, []string{"k-1", "k-2"}, order)
}

// TestRelayReadAheadNeverSkipsALateCommit: while a full round is being published the relay
// reads the next one ahead, after the round's last id. A transaction that committed late,
// with an id below, is not in it; Drain, called once the late row is committed, returns only
// after a read from the head of the outbox published it.
func TestRelayReadAheadNeverSkipsALateCommit(t *testing.T) {
	t.Parallel()
	b := setupRelay(t, 1, pgtest.Options{})
	ctx := context.Background()
	// The late transaction takes the lowest id and commits while the relay reads past it.
	late, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = late.Rollback(ctx) }()
	require.NoError(t, b.store.EnqueueTx(ctx, late, outbox.Event{Topic: b.topic, Payload: []byte("late"), Pipeline: "p", CausationID: "late"}))
	b.enqueue(t, b.events(25, "early")...) // two full rounds of 10 and five rows

	committed := make(chan struct{})
	var once sync.Once
	relay, _ := b.startRelay(t, outbox.RelayConfig{BatchSize: 10, AfterPublish: func([]int64) error {
		once.Do(func() {
			// The first round was full: the second is being read ahead, past the late
			// row's id. The late row commits now, and Drain is called before the first
			// round ends.
			if err := late.Commit(ctx); err != nil {
				t.Error(err)
			}
			close(committed)
			time.Sleep(100 * time.Millisecond)
		})
		return nil
	}})
	<-committed
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	require.NoError(t, relay.Drain(dctx))
	require.Zero(t, b.db.Count(t, "{schema}.outbox WHERE published_at IS NULL"), "Drain returned before the late row was published")
	require.GreaterOrEqual(t, relay.ReadAheads(), int64(2), "the rounds after the first were read ahead")
	records := kafkatest.ReadAll(t, b.topic, 26, 30*time.Second)
	seen := map[string]bool{}
	for _, m := range records {
		seen[string(m.Value)] = true
	}
	require.True(t, seen["late"])
	require.Len(t, seen, 26)
}

// TestRelayRoundOfOnePartitionIsOneProduceRequest: the relay's Writers differ in BatchSize
// (tieredWriter), and a round goes to one that holds it whole, so that a partition's records
// of a round go in one produce request, which the broker takes or refuses whole: a round
// split into several could land a later request while an earlier one failed, reordering a
// key. Rounds of one key, small and large, go in one request each, all of them, in order.
func TestRelayRoundOfOnePartitionIsOneProduceRequest(t *testing.T) {
	t.Parallel()
	b := setupRelay(t, 2, pgtest.Options{})
	const largest = 2500
	relay, _ := b.startRelay(t, outbox.RelayConfig{BatchSize: largest})
	b.drain(t, relay, 60*time.Second)
	relay.Stats() // zeroes the counters
	var want []string
	for _, n := range []int{3, 70, 1200, largest} {
		events := make([]outbox.Event, n)
		for i := range events {
			id := fmt.Sprintf("e-%05d", len(want))
			want = append(want, id)
			events[i] = outbox.Event{Topic: b.topic, Key: []byte("k"), Payload: []byte(id), Pipeline: "p", CausationID: id}
		}
		rounds := relay.Rounds()
		b.enqueue(t, events...)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		require.NoError(t, relay.Drain(ctx))
		cancel()
		require.Equal(t, rounds+1, relay.Rounds(), "%d rows went in one round", n)
		stats := relay.Stats() // the Writers' counters, added up
		require.EqualValues(t, 1, stats.Writes, "a round of %d rows of one partition is one produce request", n)
		require.EqualValues(t, n, stats.Messages)
	}
	records := kafkatest.ReadAll(t, b.topic, len(want), 60*time.Second)
	var got []string
	seen := map[string]bool{}
	for _, m := range records {
		if !seen[string(m.Value)] {
			seen[string(m.Value)] = true
			got = append(got, string(m.Value))
		}
	}
	require.Equal(t, want, got)
}

// TestRelayStepsDownWhenItsLockSessionEnds: a leader waiting for work whose lock session
// ends (terminated here; a server restart or idle_session_timeout does the same) steps down
// at once, and the standby takes over: never two leaders. The former leader used to miss
// it while idle, and went on publishing beside the new one.
func TestRelayStepsDownWhenItsLockSessionEnds(t *testing.T) {
	t.Parallel()
	b := setupRelay(t, 1, pgtest.Options{})
	// The first leader stays a standby once it stepped down; the second takes over. Its
	// periodic check of the lock session (LockCheck) is an hour away, so that only the end of
	// the session it waits on can step it down within the test's 10 s.
	first, _ := b.startRelay(t, outbox.RelayConfig{StandbyPoll: time.Hour, LockCheck: time.Hour, LockTimeout: 2 * time.Hour})
	select {
	case <-first.TestSignals().Leading.C():
	case <-time.After(testsignal.WaitTimeout):
		t.Fatal("the relay did not lead")
	}
	second, _ := b.startRelay(t, outbox.RelayConfig{StandbyPoll: 50 * time.Millisecond})
	b.enqueue(t, b.events(10, "before")...)
	require.NoError(t, first.Drain(context.Background()))
	require.False(t, second.IsLeader())

	// The leader is idle, waiting for a notification on its lock session: end that session.
	var n int
	require.NoError(t, b.db.Pool.QueryRow(t.Context(), `SELECT count(pg_terminate_backend(pid)) FROM pg_locks
WHERE locktype = 'advisory' AND granted AND classid = (($1::bigint >> 32) & 4294967295)::oid AND objid = ($1::bigint & 4294967295)::oid AND objsubid = 1`,
		outbox.RelayLockKey(b.db.Schema)).Scan(&n))
	require.Equal(t, 1, n, "the leader's lock session")
	require.Eventually(t, func() bool { return !first.IsLeader() }, 10*time.Second, 5*time.Millisecond,
		"the leader whose lock session ended still says it leads")
	require.Eventually(t, second.IsLeader, 10*time.Second, 5*time.Millisecond, "the standby did not take over")

	firstBefore := first.Published()
	b.enqueue(t, b.events(10, "after")...)
	b.drain(t, second, 20*time.Second)
	require.EqualValues(t, 10, second.Published())
	require.Equal(t, firstBefore, first.Published(), "the former leader published beside the new one")
	require.False(t, first.IsLeader())
	require.Len(t, kafkatest.ReadAll(t, b.topic, 20, 20*time.Second), 20, "each event once")
}

// TestRelayStandbyKeepsOneSession: a standby tries the lock every StandbyPoll on one session
// of its own, and leads on that session, instead of opening a connection at every try; when
// that session ends, it tries on a new one.
func TestRelayStandbyKeepsOneSession(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupRelay(t, 1, pgtest.Options{})
	leader, stopLeader := b.startRelay(t, outbox.RelayConfig{})
	select {
	case <-leader.TestSignals().Leading.C():
	case <-time.After(testsignal.WaitTimeout):
		t.Fatal("the relay did not lead")
	}
	// The standby's connections carry a name of their own, so that its sessions can be told
	// from the other tests'.
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	require.NoError(t, err)
	app := "standby " + b.db.Schema
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	standby, _ := b.startRelayOn(t, pool, outbox.RelayConfig{StandbyPoll: 20 * time.Millisecond})

	// sessions returns the pids of the standby's sessions that tried the lock.
	sessions := func() []int32 {
		var pids []int32
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT coalesce(array_agg(pid ORDER BY pid), '{}') FROM pg_stat_activity
WHERE application_name = $1 AND query = 'SELECT pg_try_advisory_lock($1)'`, app).Scan(&pids))
		return pids
	}
	seen := map[int32]bool{}
	for range 50 { // 1 s: fifty tries
		for _, pid := range sessions() {
			seen[pid] = true
		}
		time.Sleep(20 * time.Millisecond)
	}
	require.False(t, standby.IsLeader())
	require.Len(t, seen, 1, "the standby's sessions over fifty tries of the lock")
	var kept int32
	for pid := range seen {
		kept = pid
	}

	// Its session ends (terminated, as a server restart or an idle_session_timeout ends it):
	// it tries on a new one, and keeps that.
	var ended bool
	require.NoError(t, b.db.Pool.QueryRow(ctx, "SELECT pg_terminate_backend($1)", kept).Scan(&ended))
	require.True(t, ended)
	require.Eventually(t, func() bool {
		pids := sessions()
		return len(pids) == 1 && pids[0] != kept
	}, 10*time.Second, 10*time.Millisecond, "the standby did not try the lock on a new session")
	kept = sessions()[0]

	// The leader stops: the standby leads, on the session it kept.
	require.NoError(t, stopLeader())
	require.Eventually(t, standby.IsLeader, 10*time.Second, 5*time.Millisecond, "the standby did not take over")
	var holder int32
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT pid FROM pg_locks
WHERE locktype = 'advisory' AND granted AND classid = (($1::bigint >> 32) & 4294967295)::oid AND objid = ($1::bigint & 4294967295)::oid AND objsubid = 1`,
		outbox.RelayLockKey(b.db.Schema)).Scan(&holder))
	require.Equal(t, kept, holder, "the lock's session")
	b.enqueue(t, b.events(5, "standby")...)
	b.drain(t, standby, 20*time.Second)
	require.Len(t, kafkatest.ReadAll(t, b.topic, 5, 20*time.Second), 5)
}

// TestRelayLockSessionEndsWhenTheLeaderStopsUsingIt: the lock session ends when the leader
// stops using it for LockTimeout (idle_session_timeout), so that a leader that hangs, or
// whose connection is frozen, hands the lock to a standby; a live leader keeps it, by
// checking its session every LockCheck.
func TestRelayLockSessionEndsWhenTheLeaderStopsUsingIt(t *testing.T) {
	t.Parallel()
	b := setupRelay(t, 1, pgtest.Options{})
	live, _ := b.startRelay(t, outbox.RelayConfig{LockCheck: 200 * time.Millisecond, LockTimeout: time.Second})
	select {
	case <-live.TestSignals().Leading.C():
	case <-time.After(testsignal.WaitTimeout):
		t.Fatal("the relay did not lead")
	}
	for range 30 { // 3 s: three times its session's timeout
		require.True(t, live.IsLeader(), "a leader that checks its session lost it")
		time.Sleep(100 * time.Millisecond)
	}

	// A leader that does not check its session in time: PostgreSQL ends the session.
	b2 := setupRelay(t, 1, pgtest.Options{})
	silent, _ := b2.startRelay(t, outbox.RelayConfig{LockCheck: time.Hour, LockTimeout: time.Second, StandbyPoll: time.Hour})
	select {
	case <-silent.TestSignals().Leading.C():
	case <-time.After(testsignal.WaitTimeout):
		t.Fatal("the relay did not lead")
	}
	require.Eventually(t, func() bool { return !silent.IsLeader() }, 10*time.Second, 10*time.Millisecond,
		"the session of a leader that stopped using it was not ended")
}

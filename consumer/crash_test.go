package consumer_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/consumer"
	"github.com/idemd/idemd/internal/kafkatest"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/outbox"
	"github.com/idemd/idemd/pipeline"
)

// TestHelperProcess is the child of TestCrashAfterCommitBeforeOffsetCommit: a consumer that
// kills itself right after its first transaction committed, before the offset commit.
func TestHelperProcess(t *testing.T) {
	if os.Getenv("IDEMD_CONSUMER_CRASH_CHILD") != "1" {
		t.Skip("run by TestCrashAfterCommitBeforeOffsetCommit")
	}
	pool, err := pgxpool.New(context.Background(), pgtest.URL())
	if err != nil {
		os.Exit(2)
	}
	schema := os.Getenv("IDEMD_CONSUMER_SCHEMA")
	cfg := &consumer.Config{
		Name:              "ledger",
		Brokers:           strings.Split(os.Getenv("TEST_KAFKA_BROKERS"), ","),
		Topics:            []string{os.Getenv("IDEMD_CONSUMER_TOPIC")},
		Group:             os.Getenv("IDEMD_CONSUMER_GROUP"),
		Schema:            schema,
		Effect:            consumer.Effect{SQL: strings.ReplaceAll(effectSQL, "{schema}", `"`+schema+`"`)},
		BatchSize:         20,
		HeartbeatInterval: 100 * time.Millisecond,
		SessionTimeout:    6 * time.Second,
		Logger:            testLogger(),
		AfterCommit: func([]consumer.Message) {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		},
	}
	c, err := consumer.New(pool, cfg)
	if err != nil {
		os.Exit(2)
	}
	_ = c.Run(context.Background())
	os.Exit(3) // not reached: the hook kills the process
}

func TestCrashAfterCommitBeforeOffsetCommit(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	var msgs []kafka.Message
	for _, id := range ids("m", 50) {
		msgs = append(msgs, msg(id, 0, ""))
	}
	produce(t, b.brokers, b.topic, msgs...)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(),
		"IDEMD_CONSUMER_CRASH_CHILD=1",
		"TEST_KAFKA_BROKERS="+strings.Join(b.brokers, ","),
		"IDEMD_CONSUMER_SCHEMA="+b.db.Schema,
		"IDEMD_CONSUMER_TOPIC="+b.topic,
		"IDEMD_CONSUMER_GROUP="+b.group,
	)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "child output: %s", out)
	require.Equal(t, syscall.SIGKILL, exit.Sys().(syscall.WaitStatus).Signal(), "child output: %s", out)

	// The first batch committed in the database; its offset did not.
	applied := b.effects(t)
	require.Positive(t, applied)
	require.Less(t, applied, 50)
	require.Equal(t, int64(-1), committed(t, b.brokers, b.group, b.topic, 1)[0], "the child never committed an offset")

	// After a restart the batch is redelivered and recognised: no effect is repeated.
	start(t, b.db, b.config())
	b.waitCommitted(t, 60*time.Second, func(offs []int64) bool {
		return offs[0] == 50
	})
	require.Equal(t, 50, b.effects(t))
	require.Equal(t, 50, b.distinctEffects(t))
}

func TestRebalanceBetweenTwoInstances(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	b.db.Exec(t, b.db.Q(`ALTER TABLE {schema}.effects ADD COLUMN instance text`))
	const unique = 3000
	all := withDuplicates(ids("r", unique), 4)

	// A slow Go effect that records which instance applied each message, so that batches
	// are in flight when partitions move.
	instance := func(name string) *consumer.Config {
		cfg := b.config()
		cfg.Effect.SQL, cfg.BatchSize = "", 50
		cfg.Handler = func(ctx context.Context, tx pgx.Tx, m consumer.Message) error {
			time.Sleep(200 * time.Microsecond)
			_, err := tx.Exec(ctx, b.db.Q(`INSERT INTO {schema}.effects (message_id, instance) VALUES ($1, $2)`), m.ID, name)
			return err
		}
		return cfg
	}
	stop1 := start(t, b.db, instance("one"))
	produceAsync(t, b.brokers, b.topic, all...)
	b.until(t, 30*time.Second, "first instance applying", func() bool { return b.effects(t) > 0 })

	// A second instance joins mid-stream: partitions move while batches are in flight.
	start(t, b.db, instance("two"))
	b.until(t, 60*time.Second, "second instance applying", func() bool {
		return b.db.Count(t, "{schema}.effects WHERE instance = 'two'") > 0
	})
	// The first leaves mid-stream: its partitions move back to the second.
	stop1()

	b.until(t, 90*time.Second, "every id applied", func() bool { return b.distinctEffects(t) == unique })
	b.waitCommitted(t, 30*time.Second, func(offs []int64) bool {
		sum := int64(0)
		for _, o := range offs {
			sum += o
		}
		return sum == int64(len(all))
	})
	require.Equal(t, unique, b.effects(t))
	require.Positive(t, b.db.Count(t, "{schema}.effects WHERE instance = 'one'"))
}

// TestRestartsWithDuplicates: 10,000 records, 25% of them duplicates, consumed across at
// least three restarts of the consumer while the relay publishes the outbox, the rows the
// consumer hands over (outbox.Handoff) and the others; every event reaches its topic.
func TestRestartsWithDuplicates(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	const unique = 7500
	all := withDuplicates(ids("d", unique), 4)
	require.Len(t, all, 10000)
	out := kafkatest.Topic(t, 2)

	// Published rows are kept, so that the outbox rows can be counted: one per unique id.
	handoff := outbox.NewHandoff()
	relay, err := outbox.NewRelay(b.db.Pool, &outbox.RelayConfig{Schema: b.db.Schema, Brokers: b.brokers, KeepPublished: true,
		Handoff: handoff, Logger: testLogger()})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-relayDone })

	cfg := b.config()
	cfg.Publish = pipeline.Targets{{Topic: out, Key: &pipeline.Field{JSON: "/id"}}}
	cfg.Handoff = handoff
	produceAsync(t, b.brokers, b.topic, all...)
	restarts := 0
	for step := 1; step <= 4; step++ {
		stop := start(t, b.db, cfg)
		if step == 4 {
			break
		}
		b.until(t, 60*time.Second, "progress", func() bool { return b.effects(t) >= step*unique/5 })
		stop()
		restarts++
	}
	b.until(t, 90*time.Second, "every id applied", func() bool { return b.distinctEffects(t) == unique })
	require.GreaterOrEqual(t, restarts, 3)
	require.Equal(t, unique, b.effects(t))
	// Published rows kept are in outbox_published: both tables, in one snapshot.
	const kept = "(SELECT operation_id FROM {schema}.outbox UNION ALL SELECT operation_id FROM {schema}.outbox_published) a"
	require.Equal(t, unique, b.db.Count(t, kept))
	require.Equal(t, unique, b.db.Count(t, "(SELECT DISTINCT operation_id FROM "+kept+") o"))
	b.until(t, 60*time.Second, "every outbox row published", func() bool {
		return b.db.Count(t, "{schema}.outbox WHERE published_at IS NULL") == 0
	})
	ops := map[string]bool{}
	for _, m := range kafkatest.ReadAll(t, out, unique, 60*time.Second) {
		ops[kafkatest.Header(m, outbox.HeaderOperationID)] = true
	}
	require.Len(t, ops, unique, "every event reached its topic")
	require.Positive(t, relay.HandedRounds(), "the relay published rows the consumer handed over")
}

// withDuplicates returns one record per id plus a second one for every third id (25% of all
// records are duplicates), each on a random partition, in random order.
func withDuplicates(idList []string, partitions int) []kafka.Message {
	var out []kafka.Message
	for i, id := range idList {
		out = append(out, msg(id, rand.IntN(partitions), ""))
		if i%3 == 0 {
			out = append(out, msg(id, rand.IntN(partitions), ""))
		}
	}
	rand.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// TestOldOwnerCannotMoveOffsetBack: a member holds a committed batch whose offset it has
// not committed yet when a rebalance gives its partition to another member, which goes on
// and commits further. When the old member finally commits, its generation has ended and
// the coordinator refuses it: the partition's offset never moves back (which would make the
// new owner redo work and report lag that is not there).
func TestOldOwnerCannotMoveOffsetBack(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	first := make([]kafka.Message, 10)
	for i := range first {
		first[i] = msg(fmt.Sprintf("a%d", i), 0, "")
	}
	produce(t, b.brokers, b.topic, first...)

	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	old := b.config()
	old.AfterCommit = func([]consumer.Message) {
		once.Do(func() { close(held); <-release })
	}
	stopOld := start(t, b.db, old)
	<-held // a batch committed in PostgreSQL, its offset not yet committed

	commits := make(chan int64, 100)
	next := b.config()
	next.OnOffsetCommit = func(_ string, _ int, offset int64) { commits <- offset }
	start(t, b.db, next)
	second := make([]kafka.Message, 10)
	for i := range second {
		second[i] = msg(fmt.Sprintf("b%d", i), 0, "")
	}
	produce(t, b.brokers, b.topic, second...)
	for offset := int64(0); offset < 20; {
		select {
		case offset = <-commits:
		case <-time.After(60 * time.Second):
			t.Fatalf("the new owner did not commit offset 20 (last %d)", offset)
		}
	}

	close(release) // the old member commits offset 10, with its ended generation
	stopOld()
	require.Equal(t, int64(20), committed(t, b.brokers, b.group, b.topic, 1)[0], "the offset did not move back")
	require.Equal(t, 20, b.distinctEffects(t))
	require.Equal(t, 20, b.effects(t), "the batch the new owner read again was deduplicated")
}

package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/consumer"
	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/internal/metrics"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/outbox"
	"github.com/idemd/idemd/pipeline"
	"github.com/idemd/idemd/processed"
)

// deadLetter consumes msgs with cfg until n letters are written, stops the consumer, and
// returns the letters.
func (b *bundle) deadLetter(t *testing.T, cfg *consumer.Config, n int, msgs ...kafka.Message) []*deadletter.Letter {
	t.Helper()
	produce(t, b.brokers, b.topic, msgs...)
	stop := start(t, b.db, cfg)
	b.waitCommitted(t, 30*time.Second, func(offs []int64) bool {
		return offs[0] == int64(len(msgs))
	})
	stop()
	letters, err := deadletter.New(b.db.Schema).List(context.Background(), b.db.Pool, deadletter.Filter{Pipeline: cfg.Name})
	require.NoError(t, err)
	require.Len(t, letters, n)
	return letters
}

// testReplayer replays letters through a Consumer built with New and never run, on
// brokers nothing listens on: replays must not need Kafka.
type testReplayer struct{ rp *deadletter.Replayer }

func (r testReplayer) Replay(ctx context.Context, id int64) error {
	_, err := r.rp.Replay(ctx, id)
	return err
}

func (b *bundle) replayer(t *testing.T, cfg *consumer.Config) testReplayer {
	t.Helper()
	cfg.Brokers = []string{"127.0.0.1:1"}
	c, err := consumer.New(b.db.Pool, cfg)
	require.NoError(t, err)
	rp := deadletter.NewReplayer(b.db.Pool, deadletter.New(b.db.Schema))
	c.RegisterReplay(rp)
	return testReplayer{rp}
}

func TestReplayAppliesOnceAfterTheCauseIsFixed(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.db.Exec(t, b.db.Q(`ALTER TABLE {schema}.effects ADD CONSTRAINT no_poison CHECK (message_id <> 'poison')`))
	cfg := b.config()
	cfg.DeadLetter.MaxAttempts = 1
	cfg.Publish = pipeline.Targets{{Topic: "ledger.entries", Key: &pipeline.Field{JSON: "/id"}}}
	m := msg("poison", 0, "")
	m.Key = []byte("k1")
	m.Headers = append(m.Headers, kafka.Header{Key: "event-type", Value: []byte("entry.created")})
	letters := b.deadLetter(t, cfg, 1, msg("good", 0, ""), m)
	l := letters[0]
	require.Equal(t, "poison", l.MessageID)
	require.Equal(t, 0, b.db.Count(t, "{schema}.outbox WHERE causation_id = 'poison'"))

	// The cause is fixed; the record is replayed by a consumer that never runs.
	b.db.Exec(t, b.db.Q(`ALTER TABLE {schema}.effects DROP CONSTRAINT no_poison`))
	cfg2 := b.config()
	cfg2.Publish = cfg.Publish
	c := b.replayer(t, cfg2)
	ctx := context.Background()
	require.NoError(t, c.Replay(ctx, l.ID))

	require.Equal(t, 1, b.db.Count(t, "{schema}.effects WHERE message_id = 'poison' AND topic = $1 AND part = 0 AND off = 1", b.topic))
	require.Equal(t, 1, b.db.Count(t, "{schema}.outbox WHERE causation_id = 'poison'"))
	require.Equal(t, 1, b.db.Count(t, "{schema}.outbox WHERE causation_id = 'poison' AND operation_id = $1 AND topic = 'ledger.entries' AND key = 'poison' AND headers->>'event-type' = 'entry.created'",
		outbox.OperationID("ledger", "poison", 0)), "the same operation id, key and headers as the original path")
	// The good record's event was made by the consumed path with the same rule.
	require.Equal(t, 1, b.db.Count(t, "{schema}.outbox WHERE causation_id = 'good' AND operation_id = $1", outbox.OperationID("ledger", "good", 0)))
	require.Equal(t, 1, b.db.Count(t, "{schema}.dead_letters WHERE id = $1 AND replayed_at IS NOT NULL", l.ID))

	// Twice: refused, no second effect.
	require.ErrorIs(t, c.Replay(ctx, l.ID), deadletter.ErrAlreadyReplayed)
	require.Equal(t, 1, b.db.Count(t, "{schema}.effects WHERE message_id = 'poison'"))
	require.Equal(t, 1, b.db.Count(t, "{schema}.outbox WHERE causation_id = 'poison'"))
}

func TestReplayThatFailsAgainCommitsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.db.Exec(t, b.db.Q(`ALTER TABLE {schema}.effects ADD CONSTRAINT no_poison CHECK (message_id <> 'poison')`))
	cfg := b.config()
	cfg.DeadLetter.MaxAttempts = 1
	letters := b.deadLetter(t, cfg, 1, msg("poison", 0, ""))
	l := letters[0]

	// The publish event is queued after the SQL effect: it must roll back with it.
	cfg2 := b.config()
	cfg2.Publish = pipeline.Targets{{Topic: "ledger.entries"}}
	c := b.replayer(t, cfg2)
	err := c.Replay(context.Background(), l.ID)
	require.Error(t, err)
	require.Contains(t, err.Error(), "no_poison")
	require.Equal(t, 0, b.db.Count(t, "{schema}.effects"))
	require.Equal(t, 0, b.db.Count(t, "{schema}.outbox WHERE causation_id = 'poison'"))
	require.Equal(t, 1, b.db.Count(t, "{schema}.dead_letters WHERE id = $1 AND replayed_at IS NULL", l.ID))

	// Fixed: the same letter replays.
	b.db.Exec(t, b.db.Q(`ALTER TABLE {schema}.effects DROP CONSTRAINT no_poison`))
	require.NoError(t, c.Replay(context.Background(), l.ID))
	require.Equal(t, 1, b.db.Count(t, "{schema}.effects WHERE message_id = 'poison'"))
	require.Equal(t, 1, b.db.Count(t, "{schema}.outbox WHERE causation_id = 'poison'"))
}

func TestReplayOfARecordWithoutID(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	cfg := b.config()
	letters := b.deadLetter(t, cfg, 1, kafka.Message{Value: []byte(`{"ref":"r1"}`)})
	l := letters[0]
	require.Empty(t, l.MessageID)
	ctx := context.Background()

	// The pipeline still finds no id: a clear refusal, nothing committed.
	err := b.replayer(t, b.config()).Replay(ctx, l.ID)
	require.ErrorIs(t, err, consumer.ErrNoMessageID)
	require.Equal(t, 0, b.db.Count(t, "{schema}.effects"))
	require.Equal(t, 1, b.db.Count(t, "{schema}.dead_letters WHERE id = $1 AND replayed_at IS NULL", l.ID))

	// The pipeline now reads the id from the value: the record is applied under it, and the
	// id is claimed like a consumed record's.
	cfg2 := b.config()
	cfg2.MessageID = &pipeline.Field{JSON: "/ref"}
	require.NoError(t, b.replayer(t, cfg2).Replay(ctx, l.ID))
	require.Equal(t, 1, b.db.Count(t, "{schema}.effects WHERE message_id = 'r1'"))
	require.Equal(t, 1, b.db.Count(t, "{schema}.processed_messages WHERE scope = 'ledger' AND message_id = 'r1' AND status = 'done'"))
}

func TestReplayOfAnIDAppliedMeanwhileIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	cfg := b.config()
	cfg.MessageID = &pipeline.Field{Header: "x-id"}
	letters := b.deadLetter(t, cfg, 1, kafka.Message{Value: []byte(`{"ref":"r1"}`)})
	l := letters[0]

	// r1 arrives again, properly, and is applied.
	ctx := context.Background()
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	store, err := processed.New(&processed.Config{Schema: b.db.Schema})
	require.NoError(t, err)
	_, err = store.ClaimTx(ctx, tx, "ledger", "r1", []byte("other"))
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	cfg2 := b.config()
	cfg2.MessageID = &pipeline.Field{JSON: "/ref"}
	err = b.replayer(t, cfg2).Replay(ctx, l.ID)
	require.ErrorIs(t, err, processed.ErrConflict)
	require.Equal(t, 0, b.db.Count(t, "{schema}.effects"))
	require.Equal(t, 1, b.db.Count(t, "{schema}.dead_letters WHERE id = $1 AND replayed_at IS NULL", l.ID))
}

func TestReplayRefusesOtherLetters(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	ctx := context.Background()
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	store := deadletter.New(b.db.Schema)
	other, err := store.WriteTx(ctx, tx, &deadletter.Letter{Pipeline: "payments", Origin: deadletter.Origin{Door: deadletter.DoorKafka},
		Scope: "payments", MessageID: "m1", Payload: []byte(`{}`), Reason: "x"})
	require.NoError(t, err)
	// An HTTP delivery's letter carries the subscription's name but is the sink's.
	delivery, err := store.WriteTx(ctx, tx, &deadletter.Letter{Pipeline: "ledger", Origin: deadletter.Origin{Door: deadletter.DoorDelivery, DeliveryID: 1},
		Scope: "http:ledger", MessageID: "m2", Payload: []byte(`{}`), Reason: "x"})
	require.NoError(t, err)
	// A letter of this subscription's name under another scope is not its own.
	scoped, err := store.WriteTx(ctx, tx, &deadletter.Letter{Pipeline: "ledger", Origin: deadletter.Origin{Door: deadletter.DoorKafka},
		Scope: "other", MessageID: "m3", Payload: []byte(`{}`), Reason: "x"})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	c := b.replayer(t, b.config())
	require.ErrorIs(t, c.Replay(ctx, other), deadletter.ErrNoReplayer)
	require.ErrorIs(t, c.Replay(ctx, delivery), deadletter.ErrNoReplayer)
	require.ErrorIs(t, c.Replay(ctx, scoped), consumer.ErrUnknownPipeline)
	require.ErrorIs(t, c.Replay(ctx, 1<<40), deadletter.ErrNotFound)
	require.Equal(t, 0, b.db.Count(t, "{schema}.effects"))
}

// TestReplayKeepsTheStaleGuard: a letter whose entity has moved on is replayed as stale:
// effect skipped, letter done, counted as a stale message and a stale replay, not as
// processed.
func TestReplayKeepsTheStaleGuard(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.db.Exec(t, b.db.Q(`ALTER TABLE {schema}.effects ADD CONSTRAINT no_poison CHECK (message_id <> 'a1')`))
	cfg := b.config()
	cfg.Name = pgtest.SchemaName(t) // a pipeline of its own: its metrics are its own
	cfg.DeadLetter.MaxAttempts = 1
	cfg.Order = &pipeline.Order{Entity: pipeline.Field{JSON: "/entity"}, Version: pipeline.Field{JSON: "/version"}}
	letters := b.deadLetter(t, cfg, 1,
		msg("a1", 0, `{"entity":"A","version":1}`),
		msg("a2", 0, `{"entity":"A","version":2}`))
	require.Equal(t, "a1", letters[0].MessageID)
	b.db.Exec(t, b.db.Q(`ALTER TABLE {schema}.effects DROP CONSTRAINT no_poison`))

	// a2 is newer and applied: the replayed a1 is stale, its effect skipped, the letter done.
	cfg2 := b.config()
	cfg2.Name, cfg2.Order = cfg.Name, cfg.Order
	processed, stale := metrics.Processed.WithLabelValues(cfg.Name), metrics.Stale.WithLabelValues(cfg.Name)
	replayed := metrics.DeadLettersReplayed.WithLabelValues(cfg.Name, consumer.DoorKafka, "stale")
	before := []float64{testutil.ToFloat64(processed), testutil.ToFloat64(stale), testutil.ToFloat64(replayed)}
	require.NoError(t, b.replayer(t, cfg2).Replay(context.Background(), letters[0].ID))
	require.Equal(t, 0, b.db.Count(t, "{schema}.effects WHERE message_id = 'a1'"))
	require.Equal(t, 1, b.db.Count(t, "{schema}.effects WHERE message_id = 'a2'"))
	require.Equal(t, 1, b.db.Count(t, "{schema}.dead_letters WHERE id = $1 AND replayed_at IS NOT NULL", letters[0].ID))
	require.Equal(t, []float64{before[0], before[1] + 1, before[2] + 1},
		[]float64{testutil.ToFloat64(processed), testutil.ToFloat64(stale), testutil.ToFloat64(replayed)},
		"processed, stale, replayed as stale")
}

package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/consumer"
	"github.com/idemd/idemd/exactlyonce"
	"github.com/idemd/idemd/internal/kafkatest"
	"github.com/idemd/idemd/pipeline"
)

func TestPoisonMessageAmongGoodOnes(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	cfg := b.config()
	cfg.DeadLetter = pipeline.DeadLetter{Topic: "ledger.dlq", MaxAttempts: 3}
	cfg.Publish = pipeline.Targets{{Topic: "ledger.entries", Key: &pipeline.Field{JSON: "/id"}}}
	var msgs []kafka.Message
	for i, id := range ids("good", 100) {
		msgs = append(msgs, msg(id, 0, ""))
		if i == 50 {
			// Not JSON: the ::jsonb cast fails with a class 22 error, every time.
			msgs = append(msgs, msg("poison", 0, "not json"))
		}
	}
	produce(t, b.brokers, b.topic, msgs...)
	start(t, b.db, cfg)

	b.waitCommitted(t, 30*time.Second, func(offs []int64) bool {
		return offs[0] == 101
	})
	require.Equal(t, 100, b.effects(t))
	require.Equal(t, 100, b.distinctEffects(t))
	require.Equal(t, 0, b.db.Count(t, "{schema}.effects WHERE message_id = 'poison'"))

	var reason string
	var attempts int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), b.db.Q(
		`SELECT reason, attempts FROM {schema}.dead_letters WHERE pipeline = 'ledger' AND message_id = 'poison'`)).Scan(&reason, &attempts))
	require.Equal(t, 3, attempts)
	require.Contains(t, reason, "json")
	require.Equal(t, 1, b.db.Count(t, "{schema}.processed_messages WHERE message_id = 'poison' AND status = 'dead'"))
	require.Equal(t, 1, b.db.Count(t, "{schema}.outbox WHERE topic = 'ledger.dlq' AND causation_id = 'poison'"))
	require.Equal(t, 100, b.db.Count(t, "{schema}.outbox WHERE topic = 'ledger.entries'"))
	require.Equal(t, 0, b.db.Count(t, "{schema}.outbox WHERE topic = 'ledger.entries' AND causation_id = 'poison'"))

	// The partition keeps going.
	produce(t, b.brokers, b.topic, msg("after", 0, ""))
	b.until(t, 30*time.Second, "the next message", func() bool {
		return b.db.Count(t, "{schema}.effects WHERE message_id = 'after'") == 1
	})
}

func TestMessageWithoutIDIsDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	cfg := b.config()
	cfg.DeadLetter.Topic = "ledger.dlq"
	produce(t, b.brokers, b.topic,
		msg("a", 0, ""),
		kafka.Message{Value: []byte(`{"no":"id"}`)},
		msg("b", 0, ""))
	start(t, b.db, cfg)

	b.waitCommitted(t, 30*time.Second, func(offs []int64) bool {
		return offs[0] == 3
	})
	require.Equal(t, 2, b.effects(t))
	var reason string
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), b.db.Q(
		`SELECT reason FROM {schema}.dead_letters WHERE pipeline = 'ledger' AND message_id IS NULL`)).Scan(&reason))
	require.Equal(t, consumer.ErrNoMessageID.Error(), reason)
	require.Equal(t, 1, b.db.Count(t, "{schema}.outbox WHERE topic = 'ledger.dlq'"))
}

func TestMessageIDSources(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		spec *pipeline.Field
		m    kafka.Message
		want string
	}{
		{"default operation-id", nil, kafka.Message{Value: []byte(`{}`), Headers: []kafka.Header{{Key: "operation-id", Value: []byte("x1")}}}, "x1"},
		{"default message-id", nil, kafka.Message{Value: []byte(`{}`), Headers: []kafka.Header{{Key: "message-id", Value: []byte("x2")}}}, "x2"},
		{"default idempotency-key", nil, kafka.Message{Value: []byte(`{}`), Headers: []kafka.Header{{Key: "idempotency-key", Value: []byte("x3")}}}, "x3"},
		// A blank header is no id: the chain goes on to the next.
		{"default past a blank operation-id", nil, kafka.Message{Value: []byte(`{}`), Headers: []kafka.Header{{Key: "operation-id", Value: []byte("  ")}, {Key: "message-id", Value: []byte("x8")}}}, "x8"},
		{"header", &pipeline.Field{Header: "X-Id"}, kafka.Message{Value: []byte(`{}`), Headers: []kafka.Header{{Key: "X-Id", Value: []byte("x4")}}}, "x4"},
		{"json", &pipeline.Field{JSON: "/data/object/id"}, kafka.Message{Value: []byte(`{"data":{"object":{"id":"x5"}}}`)}, "x5"},
		{"json number", &pipeline.Field{JSON: "/n"}, kafka.Message{Value: []byte(`{"n":12345678901234567890}`)}, "12345678901234567890"},
		{"key", &pipeline.Field{Key: true}, kafka.Message{Key: []byte("x7"), Value: []byte(`{}`)}, "x7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 1)
			cfg := b.config()
			cfg.MessageID = tc.spec
			produce(t, b.brokers, b.topic, tc.m)
			start(t, b.db, cfg)
			b.until(t, 30*time.Second, "the effect", func() bool { return b.effects(t) == 1 })
			require.Equal(t, 1, b.db.Count(t, "{schema}.effects WHERE message_id = $1", tc.want))
		})
	}
}

func TestStaleEventGuard(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	cfg := b.config()
	cfg.Order = &pipeline.Order{Entity: pipeline.Field{JSON: "/entity"}, Version: pipeline.Field{JSON: "/version"}}
	ev := func(id, entity, version string, p int) kafka.Message {
		return msg(id, p, fmt.Sprintf(`{"entity":%q,"version":%s}`, entity, version))
	}
	produce(t, b.brokers, b.topic,
		ev("a1", "A", "1", 0),
		ev("a3", "A", "3", 0),
		ev("a2", "A", "2", 0),    // stale: older
		ev("a3bis", "A", "3", 0), // stale: equal
		ev("a4", "A", "4.5", 0),  // newer
		ev("b1", "B", `"2026-01-01T00:00:00Z"`, 1),
		ev("b0", "B", `"2025-12-31T23:59:59.999Z"`, 1), // stale timestamp
		ev("b2", "B", `"2026-01-01T00:00:00.000001Z"`, 1),
	)
	start(t, b.db, cfg)

	b.waitCommitted(t, 30*time.Second, func(offs []int64) bool {
		c := offs
		return c[0] == 5 && c[1] == 3
	})
	rows, err := b.db.Pool.Query(context.Background(), b.db.Q(`SELECT message_id FROM {schema}.effects ORDER BY message_id`))
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"a1", "a3", "a4", "b1", "b2"}, got)
	// Skipped messages are acknowledged: processed, not dead.
	require.Equal(t, 8, b.db.Count(t, "{schema}.processed_messages WHERE status = 'done'"))
	require.Equal(t, 1, b.db.Count(t, "{schema}.entity_versions WHERE entity = 'A' AND version = 4.5 AND message_id = 'a4'"))
}

func TestHandlerPermanentAndTransientErrors(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	cfg := b.config()
	cfg.Effect.SQL = ""
	cfg.DeadLetter.MaxAttempts = 2
	failures := 0
	cfg.Handler = func(ctx context.Context, tx pgx.Tx, m consumer.Message) error {
		switch {
		case m.ID == "bad":
			return exactlyonce.Permanent(errors.New("refused"))
		case m.ID == "flaky" && failures < 2:
			failures++ // a plain error is retried, never skipped
			return errors.New("try again")
		}
		_, err := tx.Exec(ctx, b.db.Q(`INSERT INTO {schema}.effects (message_id, off) VALUES ($1, $2)`), m.ID, m.Offset)
		return err
	}
	produce(t, b.brokers, b.topic, msg("ok1", 0, ""), msg("bad", 0, ""), msg("flaky", 0, ""), msg("ok2", 0, ""))
	start(t, b.db, cfg)

	b.waitCommitted(t, 30*time.Second, func(offs []int64) bool {
		return offs[0] == 4
	})
	require.Equal(t, 3, b.effects(t))
	require.Equal(t, 3, b.distinctEffects(t))
	require.Equal(t, 1, b.db.Count(t, "{schema}.dead_letters WHERE message_id = 'bad' AND attempts = 2 AND reason = 'refused'"))
}

func TestNewChecksConfig(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	for _, tc := range []struct {
		name   string
		mutate func(*consumer.Config)
		want   string
	}{
		{"name", func(c *consumer.Config) { c.Name = "" }, "Name is required"},
		{"topics", func(c *consumer.Config) { c.Topics = nil }, "Topics"},
		{"sql syntax", func(c *consumer.Config) { c.Effect.SQL = "INSERT INTO nowhere VALUES (@message_id" }, "SQL: does not prepare"},
		{"sql table", func(c *consumer.Config) { c.Effect.SQL = "INSERT INTO no_such_table VALUES (@message_id)" }, "SQL: does not prepare"},
		{"sql parameter", func(c *consumer.Config) {
			c.Effect.SQL = b.db.Q("INSERT INTO {schema}.effects (message_id) VALUES (@nope)")
		}, "unknown parameter @nope"},
		{"message id", func(c *consumer.Config) { c.MessageID = &pipeline.Field{Header: "a", Key: true} }, "MessageID"},
		{"json pointer", func(c *consumer.Config) { c.MessageID = &pipeline.Field{JSON: "id"} }, "MessageID"},
		{"publish", func(c *consumer.Config) { c.Publish = pipeline.Targets{{}} }, "Publish[0]: want topic"},
		{"order", func(c *consumer.Config) { c.Order = &pipeline.Order{Entity: pipeline.Field{JSON: "/e"}} }, "Order: version"},
		{"max attempts", func(c *consumer.Config) { c.DeadLetter.MaxAttempts = -1 }, "DeadLetter.MaxAttempts"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := b.config()
			tc.mutate(cfg)
			_, err := consumer.New(b.db.Pool, cfg)
			require.Error(t, err)
			require.True(t, strings.Contains(err.Error(), tc.want), "error %q does not mention %q", err, tc.want)
		})
	}
	_, err := consumer.New(b.db.Pool, b.config())
	require.NoError(t, err)

	// Brokers are needed to consume, not to replay: New takes a config without them, Run
	// refuses it.
	cfg := b.config()
	cfg.Brokers = nil
	c, err := consumer.New(b.db.Pool, cfg)
	require.NoError(t, err)
	require.ErrorContains(t, c.Run(context.Background()), "Brokers is required")
}

// TestMessageWithoutIDAfterTopicRecreated: a record without an id is deduplicated by its
// position, and a topic deleted and created again (as `idemd dev`'s in-memory broker is on
// every start) numbers its offsets from 0 again. The position of a new record must not be
// mistaken for the earlier record's: it is dead-lettered too, not counted as a conflict or a
// duplicate.
func TestMessageWithoutIDAfterTopicRecreated(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	cfg := b.config()
	produce(t, b.brokers, b.topic, kafka.Message{Value: []byte(`{"no":"id","n":1}`)})
	stop := start(t, b.db, cfg)
	b.waitCommitted(t, 30*time.Second, func(offs []int64) bool { return offs[0] == 1 })
	stop()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl := &kafka.Client{Addr: kafka.TCP(b.brokers...), Timeout: 10 * time.Second}
	res, err := cl.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{b.topic}})
	require.NoError(t, err)
	require.NoError(t, res.Errors[b.topic])
	require.Eventually(t, func() bool {
		md, err := cl.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{b.topic}})
		return err == nil && (len(md.Topics) == 0 || md.Topics[0].Error != nil)
	}, 30*time.Second, 50*time.Millisecond, "the topic is deleted")
	kafkatest.CreateTopicOn(t, b.brokers, b.topic, 1)
	produce(t, b.brokers, b.topic, kafka.Message{Value: []byte(`{"no":"id","n":2}`)})

	b.commits = kafkatest.NewCommitLog()
	cfg = b.config()
	cfg.Group = kafkatest.Group(t) + "-2" // the first group's offset belongs to the deleted topic
	start(t, b.db, cfg)
	b.waitCommitted(t, 30*time.Second, func(offs []int64) bool { return offs[0] == 1 })
	require.Equal(t, 2, b.db.Count(t, "{schema}.dead_letters WHERE pipeline = 'ledger' AND reason = $1", consumer.ErrNoMessageID.Error()),
		"both records without an id are dead-lettered")
	require.Zero(t, b.db.Count(t, "{schema}.conflicts"), "the second record is no conflict")
}

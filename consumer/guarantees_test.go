package consumer_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/consumer"
	"github.com/idemd/idemd/internal/kafkatest"
)

// TestRolledBackBatchKeepsItsOffset: a batch still failing transiently when the consumer
// stops is rolled back after ShutdownTimeout, and its offset is not committed (SPEC 2.5:
// the offset is committed only after the transaction committed; a transient failure never
// skips a message). The next consumer of the group reads it again and applies it once.
// Committing the offsets of a batch whose transaction failed passed before: no test stopped
// a Kafka consumer in the middle of a failing batch.
func TestRolledBackBatchKeepsItsOffset(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	var failing atomic.Bool
	failing.Store(true)
	calls := make(chan struct{}, 1)
	cfg := b.config()
	cfg.Effect.SQL, cfg.ShutdownTimeout = "", 300*time.Millisecond
	cfg.Handler = func(ctx context.Context, tx pgx.Tx, m consumer.Message) error {
		if failing.Load() {
			select {
			case calls <- struct{}{}:
			default:
			}
			return errors.New("the ledger's partner is down") // transient: retried
		}
		_, err := tx.Exec(ctx, b.db.Q(`INSERT INTO {schema}.effects (message_id, off) VALUES ($1, $2)`), m.ID, m.Offset)
		return err
	}
	produce(t, b.brokers, b.topic, msg("a", 0, ""), msg("b", 0, ""))
	stop := start(t, b.db, cfg)
	for range 3 { // the batch is being retried
		<-calls
	}
	stop() // rolled back after ShutdownTimeout
	require.Equal(t, []int64{-1}, committed(t, b.brokers, b.group, b.topic, 1), "no offset committed for a batch that rolled back")
	require.Zero(t, b.effects(t))

	failing.Store(false)
	start(t, b.db, cfg)
	b.waitCommitted(t, 30*time.Second, func(offs []int64) bool { return offs[0] == 2 })
	require.Equal(t, 2, b.effects(t), "both records read again and applied")
	require.Equal(t, 2, b.distinctEffects(t))
}

// secondPipeline is a consumer config of b's topic for the pipeline name (another one, or
// "ledger" read again), in a group of its own, with a commit log of its own.
func (b *bundle) secondPipeline(t *testing.T, name string) (*consumer.Config, *kafkatest.CommitLog) {
	cfg := b.config()
	commits := kafkatest.NewCommitLog()
	cfg.Name, cfg.Group, cfg.OnOffsetCommit = name, kafkatest.Group(t)+"-"+name, commits.Record
	return cfg, commits
}

// TestSubscriptionRetentionReachesRecords: a subscription's retention is its records'
// (SPEC 1.6): a record expires its pipeline's retention after it was received, the
// default's (7 days) without one. Dropping the subscription's retention (the store's
// default for every record) passed before: no consumer test read a record's expiry.
func TestSubscriptionRetentionReachesRecords(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, msg("a", 0, ""))
	start(t, b.db, b.config()) // "ledger": the default retention
	short, shortCommits := b.secondPipeline(t, "short")
	short.Retention = 50 * time.Hour
	start(t, b.db, short)
	b.waitCommitted(t, 30*time.Second, func(offs []int64) bool { return offs[0] == 1 })
	shortCommits.Wait(t, 30*time.Second, 1, func(offs []int64) bool { return offs[0] == 1 })

	for scope, want := range map[string]time.Duration{"ledger": 7 * 24 * time.Hour, "short": 50 * time.Hour} {
		var kept float64
		require.NoError(t, b.db.Pool.QueryRow(t.Context(), b.db.Q(
			`SELECT extract(epoch FROM expires_at - received_at) FROM {schema}.processed_messages WHERE scope = $1 AND message_id = 'a'`), scope).Scan(&kept), scope)
		require.InDelta(t, want.Seconds(), kept, 60, "pipeline %q keeps its record %s", scope, time.Duration(kept*float64(time.Second)))
	}
}

// TestFingerprintIsCanonicalJSON: a record is a duplicate when its value is the same JSON
// document, whatever its key order or spacing, and a conflict only when the document
// differs (docs/consumer.md: the canonical-JSON fingerprint). A producer that serialises a
// retried event again must not see it refused. Fingerprinting the raw bytes passed before:
// every test repeated a record byte for byte.
func TestFingerprintIsCanonicalJSON(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic,
		msg("x", 0, `{"id":"x","amount":1,"tags":["a","b"]}`),
		msg("x", 0, "{ \"tags\": [\"a\", \"b\"],\n  \"amount\": 1, \"id\": \"x\" }"), // the same document
		msg("x", 0, `{"id":"x","amount":2,"tags":["a","b"]}`),                        // another one
	)
	start(t, b.db, b.config())
	b.waitCommitted(t, 30*time.Second, func(offs []int64) bool { return offs[0] == 3 })
	require.Equal(t, 1, b.effects(t))
	require.Equal(t, 1, b.db.Count(t, "{schema}.conflicts WHERE message_id = 'x'"), "only the other document conflicts")
	require.Equal(t, 1, b.db.Count(t, "{schema}.conflicts WHERE message_id = 'x' AND convert_from(payload, 'UTF8')::jsonb->>'amount' = '2'"))
}

// TestRecordWithoutIDDeadLetteredOnce: a record without an id is dead-lettered by its
// position, so a second delivery of it (here: a second group of the pipeline reading the
// topic from its start, as after an offset reset) is a duplicate, not a second dead letter
// (SPEC 1.1: the dead-letter record is an effect, applied once). Keying it anew on each
// delivery passed before: no test delivered such a record twice.
func TestRecordWithoutIDDeadLetteredOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	produce(t, b.brokers, b.topic, msg("a", 0, ""), kafka.Message{Value: []byte(`{"no":"id"}`)})
	stop := start(t, b.db, b.config())
	b.waitCommitted(t, 30*time.Second, func(offs []int64) bool { return offs[0] == 2 })
	stop()

	again, commits := b.secondPipeline(t, "ledger")
	start(t, b.db, again)
	commits.Wait(t, 30*time.Second, 1, func(offs []int64) bool { return offs[0] == 2 })
	require.Equal(t, 1, b.effects(t))
	require.Equal(t, 1, b.db.Count(t, "{schema}.dead_letters WHERE pipeline = 'ledger' AND reason = $1", consumer.ErrNoMessageID.Error()),
		"dead-lettered once")
}

package consumer_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/consumer"
	"github.com/idemd/idemd/outbox"
	"github.com/idemd/idemd/pipeline"
)

// TestSubscriptionRouting: a subscription's composite id (two headers, joined
// length-prefixed) and its fan-out, filtered on the record's event-type header: each
// matching target gets one event with its own operation id; a redelivered record (same
// parts) is a duplicate, one differing only in the second part is a new message.
func TestSubscriptionRouting(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	cfg := b.config()
	cfg.MessageID = &pipeline.Field{Parts: []pipeline.Field{{Header: "entity"}, {Header: "seq"}}}
	cfg.Publish = pipeline.Targets{
		{Name: "all", Topic: "ledger.all"},
		{Name: "refunds", Topic: "ledger.refunds", Filter: &pipeline.Filter{Type: []string{"charge.refund*"}}},
	}
	committed := make(chan int64, 16)
	cfg.OnOffsetCommit = func(_ string, _ int, next int64) { committed <- next }
	rec := func(entity, seq, eventType string) kafka.Message {
		return kafka.Message{Value: []byte(`{"n":1}`), Headers: []kafka.Header{
			{Key: "entity", Value: []byte(entity)}, {Key: "seq", Value: []byte(seq)}, {Key: "event-type", Value: []byte(eventType)},
		}}
	}
	produce(t, b.brokers, b.topic,
		rec("ch_1", "1", "charge.refunded"),
		rec("ch_1", "2", "charge.succeeded"),
		rec("ch_1", "1", "charge.refunded"), // redelivered
		kafka.Message{Value: []byte(`{}`), Headers: []kafka.Header{{Key: "entity", Value: []byte("ch_2")}}}, // no seq
	)
	start(t, b.db, cfg)
	for next := int64(0); next < 4; {
		select {
		case next = <-committed:
		case <-time.After(60 * time.Second):
			t.Fatal("the records were not committed")
		}
	}

	require.Equal(t, 2, b.effects(t), "two messages, the redelivery deduplicated")
	require.Equal(t, 2, b.db.Count(t, "{schema}.effects WHERE message_id IN ('4:ch_1/1:1', '4:ch_1/1:2')"))
	require.Equal(t, 1, b.db.Count(t, "{schema}.dead_letters WHERE reason = 'no message id'"), "a missing part is a missing id")
	var refund uuid.UUID
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), b.db.Q(
		`SELECT operation_id FROM {schema}.outbox WHERE topic = 'ledger.refunds'`)).Scan(&refund))
	require.Equal(t, outbox.TargetOperationID("ledger", "4:ch_1/1:1", "refunds"), refund, "only the refund passes the filter")
	require.Equal(t, 2, b.db.Count(t, "{schema}.outbox WHERE topic = 'ledger.all'"))
	require.Equal(t, 1, b.db.Count(t, b.db.Q(`{schema}.outbox WHERE topic = 'ledger.all' AND operation_id = '`)+
		outbox.TargetOperationID("ledger", "4:ch_1/1:1", "all").String()+"'"))
}

// TestPublishedContentType: a record without a content-type header is published as
// application/json exactly when its value is JSON to encoding/json (json.Valid and valid
// UTF-8), whatever the fingerprint made of it, and as application/octet-stream otherwise;
// a content-type header is passed on.
func TestPublishedContentType(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	cfg := b.config()
	cfg.Effect = consumer.Effect{SQL: b.db.Q(`INSERT INTO {schema}.effects (message_id, payload, topic, part, off)
VALUES (@message_id, to_jsonb(@payload::text), @topic, @partition, @offset)`)}
	cfg.Publish = pipeline.Targets{{Topic: "ledger.out"}}
	want := map[string]string{
		"object":    "application/json",
		"spaces":    "application/json",
		"surrogate": "application/json",         // JSON, though not canonical JSON (fingerprinted raw)
		"formfeed":  "application/octet-stream", // canonical JSON, but not JSON to encoding/json
		"text":      "application/octet-stream",
		"declared":  "text/plain",
	}
	typed := msg("declared", 0, `{"a":1}`)
	typed.Headers = append(typed.Headers, kafka.Header{Key: outbox.HeaderContentType, Value: []byte("text/plain")})
	produce(t, b.brokers, b.topic,
		msg("object", 0, `{"a":1}`), msg("spaces", 0, " [1] \n\t"), msg("surrogate", 0, `"\ud800"`),
		msg("formfeed", 0, "1 \f"), msg("text", 0, "not json"), typed)
	start(t, b.db, cfg)
	b.waitCommitted(t, 60*time.Second, func(offs []int64) bool { return offs[0] == int64(len(want)) })

	rows, err := b.db.Pool.Query(context.Background(), b.db.Q(
		`SELECT causation_id, coalesce(headers->>'content-type', '') FROM {schema}.outbox WHERE topic = 'ledger.out'`))
	require.NoError(t, err)
	got := map[string]string{}
	for rows.Next() {
		var id, ct string
		require.NoError(t, rows.Scan(&id, &ct))
		got[id] = ct
	}
	require.NoError(t, rows.Err())
	require.Equal(t, want, got)
}

// TestKafkaHeadersAsEveryReaderSeesThem: a Kafka record's headers, first value of each name,
// reach each reader the same: the id (default chain), @headers of the effect, the event-type
// filter of a target, the published content type, a Go handler's and AfterCommit's
// Message.Headers (never nil, even for a record without headers).
func TestKafkaHeadersAsEveryReaderSeesThem(t *testing.T) {
	t.Parallel()
	hs := []kafka.Header{
		{Key: "message-id", Value: []byte("m-1")}, {Key: "event-type", Value: []byte("order.created")},
		{Key: "content-type", Value: []byte("application/x-order")},
		{Key: "dup", Value: []byte("first")}, {Key: "dup", Value: []byte("second")},
	}
	want := map[string]string{"message-id": "m-1", "event-type": "order.created", "content-type": "application/x-order", "dup": "first"}

	t.Run("effect SQL", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 1)
		cfg := b.config()
		cfg.Effect = consumer.Effect{SQL: b.db.Q(`INSERT INTO {schema}.effects (message_id, payload, topic, part, off)
VALUES (@message_id, @headers::jsonb, @topic, @partition, @offset)`)}
		cfg.Publish = pipeline.Targets{{Topic: "ledger.orders", Filter: &pipeline.Filter{Type: []string{"order.*"}}}}
		var after []consumer.Message
		var mu sync.Mutex
		cfg.AfterCommit = func(ms []consumer.Message) { mu.Lock(); after = append(after, ms...); mu.Unlock() }
		produce(t, b.brokers, b.topic, kafka.Message{Value: []byte(`{"n":1}`), Headers: hs},
			kafka.Message{Value: []byte(`{"n":2}`), Headers: []kafka.Header{{Key: "operation-id", Value: []byte("m-2")}}})
		start(t, b.db, cfg)
		b.waitCommitted(t, 60*time.Second, func(offs []int64) bool { return offs[0] == 2 })

		var got map[string]string
		require.NoError(t, b.db.Pool.QueryRow(context.Background(), b.db.Q(`SELECT payload FROM {schema}.effects WHERE message_id = 'm-1'`)).Scan(&got))
		require.Equal(t, want, got, "@headers")
		require.Equal(t, 1, b.db.Count(t, "{schema}.outbox WHERE topic = 'ledger.orders' AND causation_id = 'm-1' AND headers->>'content-type' = 'application/x-order'"),
			"the event-type filter passed it, its content type passed on")
		require.Equal(t, 0, b.db.Count(t, "{schema}.outbox WHERE causation_id = 'm-2'"), "no event-type: filtered out")
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, after, 2)
		require.Equal(t, want, after[0].Headers, "AfterCommit")
		require.Equal(t, map[string]string{"operation-id": "m-2"}, after[1].Headers)
	})

	t.Run("handler", func(t *testing.T) {
		t.Parallel()
		b := setup(t, 1)
		cfg := b.config()
		cfg.Effect = consumer.Effect{}
		cfg.MessageID = &pipeline.Field{Key: true}
		seen := make(chan consumer.Message, 4)
		cfg.Handler = func(_ context.Context, _ pgx.Tx, m consumer.Message) error {
			seen <- m
			return nil
		}
		produce(t, b.brokers, b.topic, kafka.Message{Key: []byte("k-1"), Value: []byte(`{}`), Headers: hs},
			kafka.Message{Key: []byte("k-2"), Value: []byte(`{}`)})
		start(t, b.db, cfg)
		for range 2 {
			select {
			case m := <-seen:
				if m.ID == "k-1" {
					require.Equal(t, want, m.Headers)
				} else {
					require.NotNil(t, m.Headers, "a record without headers")
					require.Empty(t, m.Headers)
				}
			case <-time.After(60 * time.Second):
				t.Fatal("the handler did not run")
			}
		}
	})
}

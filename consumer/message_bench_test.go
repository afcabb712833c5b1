package consumer

import (
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/pipeline"
)

// BenchmarkMessage builds the unit's message of a Kafka record as the bench's consumer
// child configures it (a SQL effect, one publish target, no dead-letter topic), from the
// fetched record on: newRecord and message, in a batch's unit message kept from batch to
// batch (unitSlab). Its allocations per record are the door's share of the consumer's
// garbage.
func BenchmarkMessage(b *testing.B) {
	c := messageConsumer(b)
	recs := benchRecords(1000)
	now := time.Now()
	b.ReportAllocs()
	i := 0
	var u unitMessage
	for b.Loop() {
		u = unitMessage{}
		m := c.message(&u, newRecord(c.cfg.Name, recs[i%len(recs)], now))
		if m.Invalid != nil {
			b.Fatal(m.Invalid)
		}
		i++
	}
}

// messageConsumer is a Consumer with the bench child's pipeline, not running.
func messageConsumer(tb testing.TB) *Consumer {
	db := pgtest.New(tb)
	_, err := db.Pool.Exec(tb.Context(), `CREATE TABLE `+db.Schema+`.effects (
    message_id text NOT NULL, payload jsonb, topic text, part int, off bigint)`)
	require.NoError(tb, err)
	c, err := New(db.Pool, &Config{
		Name:   "bench",
		Topics: []string{"events"},
		Schema: db.Schema,
		Effect: Effect{SQL: `INSERT INTO ` + db.Schema + `.effects (message_id, payload, topic, part, off)
VALUES (@message_id, @payload::jsonb, @topic, @partition, @offset)`},
		Publish: pipeline.Targets{{Topic: "events-out"}},
	})
	require.NoError(tb, err)
	return c
}

// benchRecords are n Kafka records as fetched: a key, three headers and a JSON value of
// about 450 bytes.
func benchRecords(n int) []kafka.Message {
	out := make([]kafka.Message, n)
	for i := range out {
		id := fmt.Sprintf("evt_%08d", i)
		out[i] = kafka.Message{
			Topic: "events", Partition: i % 6, Offset: int64(100000 + i), Key: []byte(fmt.Sprintf("cus_%05d", i%997)),
			Headers: []kafka.Header{
				{Key: "operation-id", Value: []byte(id)},
				{Key: "event-type", Value: []byte("payment_intent.succeeded")},
				{Key: "traceparent", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")},
			},
			Value: fmt.Appendf(nil, `{"id":%q,"object":"event","api_version":"2024-06-20","type":"payment_intent.succeeded","created":%d,"livemode":false,"pending_webhooks":1,"data":{"object":{"id":"pi_%06d","object":"payment_intent","amount":%d,"amount_received":%d,"currency":"eur","customer":"cus_%05d","description":"Order %d","status":"succeeded","metadata":{"order_id":"ord_%07d","channel":"web"}}},"request":{"id":"req_%010d","idempotency_key":null}}`,
				id, 1700000000+i, i%50000, 100+i%9000, 100+i%9000, i%997, i, i, i),
			Time: time.Unix(1700000000+int64(i), 0),
		}
	}
	return out
}

// TestUnitSlabComesBackZero: a batch's unit messages are handed out zero, whether the pool
// gives back an earlier batch's (cleared when it was put back, so that it pins no record)
// or new ones.
func TestUnitSlabComesBackZero(t *testing.T) {
	r := &record{}
	for range 3 {
		us, done := unitSlab(3)
		require.Len(t, us, 3)
		for i := range us {
			require.Zero(t, us[i], "unit message %d", i)
			us[i].r, us[i].m.ID = r, "id"
		}
		done()
	}
}

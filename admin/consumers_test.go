package admin_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/admin"
	"github.com/idemd/idemd/consumer"
	"github.com/idemd/idemd/internal/kafkatest"
	"github.com/idemd/idemd/internal/sqstest"
)

// The consumers view reads the group's committed offsets and the partitions' end offsets
// from a real Kafka-protocol broker, and the last committed batch from processed_messages.
func TestConsumersLagAndLastBatch(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	topic := kafkatest.Topic(t, 2)
	group := kafkatest.Group(t)
	ctx := context.Background()

	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Balancer: &kafka.RoundRobin{}, BatchSize: 1}
	defer w.Close()
	for i := 0; i < 10; i++ {
		require.NoError(t, w.WriteMessages(ctx, kafka.Message{Value: []byte("x")}))
	}
	// The group committed 3 records of partition 0 and none of partition 1.
	client := &kafka.Client{Addr: kafka.TCP(brokers...)}
	res, err := client.OffsetCommit(ctx, &kafka.OffsetCommitRequest{GroupID: group, GenerationID: -1,
		Topics: map[string][]kafka.OffsetCommit{topic: {{Partition: 0, Offset: 3}}}})
	require.NoError(t, err)
	for _, ps := range res.Topics {
		for _, p := range ps {
			require.NoError(t, p.Error)
		}
	}

	kc := &admin.KafkaConsumers{Brokers: brokers, Subscriptions: []admin.KafkaSubscription{{Pipeline: "ledger", Group: group, Topics: []string{topic}}}}
	b := setup(t, options{tokens: testToken, consumers: kc})
	kc.Pool, kc.Schema = b.db.Pool, b.db.Schema
	b.db.Exec(t, b.db.Q(`INSERT INTO {schema}.processed_messages (scope, message_id, fingerprint, status, received_at, expires_at) VALUES
		('ledger', 'a', '\x00', 'done', '2026-03-01T10:00:00Z', now() + interval '1 day'),
		('ledger', 'b', '\x00', 'done', '2026-03-01T11:00:00Z', now() + interval '1 day'),
		('ledger', 'c', '\x00', 'done', '2026-03-01T11:00:00Z', now() + interval '1 day')`))

	r := b.get(t, "/api/v1/consumers")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	cs := r.data(t)
	require.Len(t, cs, 1)
	c := cs[0]
	require.Empty(t, c["error"])
	require.Equal(t, group, c["group"])
	parts := c["partitions"].([]any)
	require.Len(t, parts, 2)
	p0, p1 := parts[0].(map[string]any), parts[1].(map[string]any)
	require.EqualValues(t, 3, p0["committed"])
	require.EqualValues(t, p0["end"].(float64)-3, p0["lag"])
	require.EqualValues(t, p1["end"], p1["lag"], "nothing committed: the whole partition lags")
	require.EqualValues(t, 10-3, c["lag"])
	last := c["last_batch"].(map[string]any)
	require.EqualValues(t, 2, last["messages"])
	require.Equal(t, "c", last["last_message_id"])
	require.Equal(t, "2026-03-01T11:00:00Z", last["committed_at"])
	require.EqualValues(t, -1, p1["committed"])
	page := string(b.call(t, "GET", "/ui/consumers", testToken, nil).body)
	require.Contains(t, page, "<strong>7</strong> records")
	require.Contains(t, page, "<td>none committed</td>", "offset -1 reads as none committed")
}

// Pub/Sub and SQS subscriptions are listed with their subscription or queue, the backlog
// where the broker reports it (an SQS queue's, read by the consumer from goaws), and their
// last committed batch.
func TestConsumersOfBrokerSubscriptions(t *testing.T) {
	t.Parallel()
	url := sqstest.Queue(t, nil)
	sqstest.Send(t, url, sqstest.Message{Body: "a"}, sqstest.Message{Body: "b"})
	kc := &admin.KafkaConsumers{}
	b := setup(t, options{tokens: testToken, consumers: kc})
	kc.Pool, kc.Schema = b.db.Pool, b.db.Schema
	c, err := consumer.New(b.db.Pool, &consumer.Config{
		Name: "payments", Schema: b.db.Schema, SQS: &consumer.SQS{Queue: url}, SQSClient: sqstest.Client(t),
	})
	require.NoError(t, err)
	kc.Brokered = []admin.BrokerSubscription{
		{Pipeline: "orders", Door: "pubsub", Subscription: "orders-idemd"},
		{Pipeline: "payments", Door: "sqs", Subscription: url, Backlog: c.Backlog},
	}
	b.db.Exec(t, b.db.Q(`INSERT INTO {schema}.processed_messages (scope, message_id, fingerprint, status, received_at, expires_at) VALUES
		('orders', 'a', '\x00', 'done', '2026-03-01T10:00:00Z', now() + interval '1 day')`))

	r := b.get(t, "/api/v1/consumers")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	cs := r.data(t)
	require.Len(t, cs, 2)
	orders, payments := cs[0], cs[1]
	require.Equal(t, "pubsub", orders["door"])
	require.Equal(t, "orders-idemd", orders["subscription"])
	require.NotContains(t, orders, "backlog", "Pub/Sub does not report it")
	require.Equal(t, "a", orders["last_batch"].(map[string]any)["last_message_id"])
	require.Equal(t, "sqs", payments["door"])
	require.EqualValues(t, 2, payments["backlog"])
	require.Empty(t, payments["error"])

	page := b.get(t, "/ui/consumers")
	require.Equal(t, http.StatusOK, page.status)
	require.Contains(t, string(page.body), "orders-idemd")
	require.Contains(t, string(page.body), "Backlog: <strong>2</strong>")
}

// Without brokers the lag is unknown: absent from the API (not 0), "unknown" on the
// console, with the cause named.
func TestConsumersLagUnknownWithoutBrokers(t *testing.T) {
	t.Parallel()
	kc := &admin.KafkaConsumers{Subscriptions: []admin.KafkaSubscription{{Pipeline: "ledger", Group: "g", Topics: []string{"payments"}}}}
	b := setup(t, options{tokens: testToken, consumers: kc})
	kc.Pool, kc.Schema = b.db.Pool, b.db.Schema
	cs := b.get(t, "/api/v1/consumers").data(t)
	require.Len(t, cs, 1)
	require.NotContains(t, cs[0], "lag", "an unknown lag is absent, not 0")
	require.Contains(t, cs[0]["error"], "IDEMD_KAFKA_BROKERS")
	page := b.call(t, "GET", "/ui/consumers", testToken, nil)
	require.Equal(t, http.StatusOK, page.status)
	require.Contains(t, string(page.body), "<strong>unknown</strong>")
}

package outbox_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/outbox"
)

// A destination survives its encoding in Event.Topic; a Kafka topic, which has no ':', is
// never read as another kind.
func TestParseDestination(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ topic, kind, name string }{
		{"orders.created", "kafka", "orders.created"},
		{outbox.PubSubDestination("orders"), "pubsub", "orders"},
		{outbox.PubSubDestination("projects/p/topics/t"), "pubsub", "projects/p/topics/t"},
		{outbox.SQSDestination("payments.fifo"), "sqs", "payments.fifo"},
		{outbox.SQSDestination("https://sqs.eu-west-1.amazonaws.com/1/q"), "sqs", "https://sqs.eu-west-1.amazonaws.com/1/q"},
	} {
		kind, name := outbox.ParseDestination(c.topic)
		require.Equal(t, [2]string{c.kind, c.name}, [2]string{kind, name}, c.topic)
		if kind == outbox.DestinationKafka {
			require.NoError(t, outbox.CheckKafkaTopic(name))
		}
	}
	require.Error(t, outbox.CheckKafkaTopic("pubsub:orders"), "an encoded destination is no Kafka topic")
}

func TestCheckDestinationNames(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"orders", "projects/my-project/topics/orders", "projects/example.com:my-project/topics/o-1"} {
		require.NoError(t, outbox.CheckPubSubTopic(ok), ok)
	}
	for _, bad := range []string{"", "ab", "1orders", "googorders", "projects/p/topics/orders", "projects/my-project/subscriptions/x", strings.Repeat("a", 256)} {
		require.Error(t, outbox.CheckPubSubTopic(bad), bad)
	}
	for _, ok := range []string{"q", "payments.fifo", strings.Repeat("q", 80), strings.Repeat("q", 75) + ".fifo", "https://sqs.eu-west-1.amazonaws.com/123456789012/payments.fifo"} {
		require.NoError(t, outbox.CheckSQSQueue(ok), ok)
	}
	for _, bad := range []string{"", "pay ments", strings.Repeat("q", 81), strings.Repeat("q", 76) + ".fifo", "q.fif0", "ftp://x/q", "https://x/"} {
		require.Error(t, outbox.CheckSQSQueue(bad), bad)
	}
	require.True(t, outbox.SQSFIFO("https://sqs.eu-west-1.amazonaws.com/1/payments.fifo"))
	require.False(t, outbox.SQSFIFO("payments"))
}

// An event whose encoded destination names nothing is refused when enqueued.
func TestEnqueueRefusesAnEmptyDestination(t *testing.T) {
	t.Parallel()
	for _, topic := range []string{outbox.SQSDestination(""), outbox.PubSubDestination("")} {
		err := outbox.New(nil).Queue(&pgx.Batch{}, outbox.Event{Topic: topic, Pipeline: "p", CausationID: "m"})
		require.ErrorIs(t, err, outbox.ErrInvalidEvent, topic)
	}
	require.NoError(t, outbox.New(nil).Queue(&pgx.Batch{}, outbox.Event{Topic: outbox.SQSDestination("q"), Pipeline: "p", CausationID: "m"}))
}

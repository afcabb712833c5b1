package kafkatopic_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/kafkatest"
	"github.com/idemd/idemd/internal/kafkatopic"
)

// TestCreate: new topics are visible with their partitions when Create returns; an existing
// one is kept; a topic the broker refuses is an error naming it, with the broker's answer.
func TestCreate(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl := &kafka.Client{Addr: kafka.TCP(kafkatest.Brokers(t)...)}
	existing := kafkatest.Topic(t, 1)
	fresh := kafkatest.Name(t, "fresh")
	require.NoError(t, kafkatopic.Create(ctx, cl,
		kafka.TopicConfig{Topic: fresh, NumPartitions: 4, ReplicationFactor: 1},
		kafka.TopicConfig{Topic: existing, NumPartitions: 3, ReplicationFactor: 1}))

	md, err := cl.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{fresh, existing}})
	require.NoError(t, err)
	parts := map[string]int{}
	for _, topic := range md.Topics {
		require.NoError(t, topic.Error)
		parts[topic.Name] = len(topic.Partitions)
	}
	require.Equal(t, map[string]int{fresh: 4, existing: 1}, parts, "an existing topic is kept as it is")

	// Kafka refuses a name that differs from an existing one only in '.' against '_'.
	colliding := strings.ReplaceAll(existing, ".", "_")
	err = kafkatopic.Create(ctx, cl, kafka.TopicConfig{Topic: colliding, NumPartitions: 1, ReplicationFactor: 1})
	require.ErrorContains(t, err, colliding)
	var refused *kafkatopic.RefusedError
	require.ErrorAs(t, err, &refused)
	require.Equal(t, colliding, refused.Topic)
	var ke kafka.Error
	require.ErrorAs(t, err, &ke, "the broker's answer is in the chain")
}

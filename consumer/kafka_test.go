package consumer_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/kafkatest"
)

// TestReaderStatsPerPartition: each partition reader's kafka-go statistics carry the
// subscription's name in pipeline and the partition in topic and partition, as
// idemd_consumer_lag does, so that sum by (pipeline) adds up a subscription's readers. The
// pipeline label once held "pipeline/topic/partition". A stopped consumer exports none.
func TestReaderStatsPerPartition(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	produce(t, b.brokers, b.topic, perPartition(5, 3)...)
	cfg := b.config()
	cfg.Name = kafkatest.Name(t, "reader")
	stop := start(t, b.db, cfg)
	b.until(t, 30*time.Second, "8 effects", func() bool { return b.effects(t) == 8 })

	require.Equal(t, map[string]float64{b.topic + "/0": 5, b.topic + "/1": 3},
		partitionSeries(t, "idemd_kafka_reader_messages_total", cfg.Name))
	require.Len(t, partitionSeries(t, "idemd_kafka_reader_queue_capacity", cfg.Name), 2)

	stop()
	require.Empty(t, partitionSeries(t, "idemd_kafka_reader_messages_total", cfg.Name))
}

package metrics_test

import (
	"context"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/kafkatest"
	"github.com/idemd/idemd/internal/metrics"
	"github.com/idemd/idemd/internal/pgtest"
)

// series returns the values of family name whose labels include match, by the remaining
// labels' values joined with ",".
func series(t *testing.T, name string, match map[string]string) map[string]float64 {
	t.Helper()
	families, err := metrics.Registry.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			key := ""
			for _, l := range m.GetLabel() {
				if v, ok := match[l.GetName()]; ok {
					if v != l.GetValue() {
						continue next
					}
					continue
				}
				key += l.GetValue()
			}
			out[key] = value(m)
		}
	}
	return out
}

func value(m *dto.Metric) float64 {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	}
	return 0
}

// TestPoolStats: the pool's connections by state and its acquire counters are exported
// while the pool is watched, and not after.
//
// Not parallel: the pool series are the sum over the process's watched pools.
func TestPoolStats(t *testing.T) {
	pool := pgtest.Pool(t, 4)
	stop := metrics.WatchPool(pool)
	ctx := t.Context()
	a, err := pool.Acquire(ctx)
	require.NoError(t, err)
	b, err := pool.Acquire(ctx)
	require.NoError(t, err)

	require.Equal(t, 2.0, series(t, "idemd_db_pool_connections", nil)["acquired"])
	require.Equal(t, 4.0, series(t, "idemd_db_pool_max_connections", nil)[""])
	require.GreaterOrEqual(t, series(t, "idemd_db_pool_acquires_total", nil)[""], 2.0)
	require.Positive(t, series(t, "idemd_db_pool_acquire_seconds_total", nil)[""])

	a.Release()
	b.Release()
	require.Equal(t, 0.0, series(t, "idemd_db_pool_connections", nil)["acquired"])
	require.GreaterOrEqual(t, series(t, "idemd_db_pool_connections", nil)["idle"], 1.0)

	stop()
	stop() // safe twice
	require.Empty(t, series(t, "idemd_db_pool_connections", nil), "an unwatched pool exports nothing")
}

// TestKafkaStats: a writer's and a reader's statistics are accumulated across scrapes
// (kafka-go zeroes its counters at each Stats call) and deleted when the watch stops.
func TestKafkaStats(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	topic := kafkatest.Topic(t, 1)
	client := kafkatest.Name(t, "writer")
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireAll}
	defer w.Close()
	stopW := metrics.WatchKafkaWriter(client, w)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	require.NoError(t, w.WriteMessages(ctx, kafka.Message{Value: []byte("a")}, kafka.Message{Value: []byte("b")}))
	byClient := map[string]string{"client": client}
	require.Equal(t, 2.0, series(t, "idemd_kafka_writer_messages_total", byClient)[""])
	require.NoError(t, w.WriteMessages(ctx, kafka.Message{Value: []byte("c")}))
	require.Equal(t, 3.0, series(t, "idemd_kafka_writer_messages_total", byClient)[""], "counters add up across scrapes")
	require.Equal(t, 0.0, series(t, "idemd_kafka_writer_errors_total", byClient)[""])
	require.Positive(t, series(t, "idemd_kafka_writer_writes_total", byClient)[""])
	stopW()
	require.Empty(t, series(t, "idemd_kafka_writer_messages_total", byClient))

	// A partition's reader: pipeline, topic and partition are labels of their own.
	pipeline := kafkatest.Name(t, "reader")
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: 0, MaxWait: 50 * time.Millisecond})
	defer r.Close()
	stopR := metrics.WatchKafkaReader(pipeline, topic, 0, r)
	defer stopR()
	for range 3 {
		_, err := r.ReadMessage(ctx)
		require.NoError(t, err)
	}
	byPartition := map[string]string{"pipeline": pipeline, "topic": topic, "partition": "0"}
	require.Equal(t, 3.0, series(t, "idemd_kafka_reader_messages_total", byPartition)[""])
	require.Equal(t, 3.0, series(t, "idemd_kafka_reader_messages_total", byPartition)[""], "a second scrape does not lose them")
	require.Contains(t, series(t, "idemd_kafka_reader_queue_capacity", byPartition), "")
	stopR()
	require.Empty(t, series(t, "idemd_kafka_reader_messages_total", map[string]string{"pipeline": pipeline}))
}

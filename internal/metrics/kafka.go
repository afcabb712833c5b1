package metrics

import (
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
)

// ReaderStatser is what WatchKafkaReader needs of a consumer; *kafka.Reader has it.
type ReaderStatser interface{ Stats() kafka.ReaderStats }

// WriterStatser is what WatchKafkaWriter needs of a producer; *kafka.Writer has it.
type WriterStatser interface{ Stats() kafka.WriterStats }

// kafka-go's Stats() returns its counters since the previous call and zeroes them, so one
// collector owns each reader or writer: it calls Stats at every scrape and adds the deltas
// to Prometheus counters of its own.
var (
	kafkaReaders = newStatsCollector(func(r ReaderStatser, add func(string, float64), set func(string, float64)) {
		s := r.Stats()
		add("idemd_kafka_reader_dials_total", float64(s.Dials))
		add("idemd_kafka_reader_fetches_total", float64(s.Fetches))
		add("idemd_kafka_reader_messages_total", float64(s.Messages))
		add("idemd_kafka_reader_bytes_total", float64(s.Bytes))
		add("idemd_kafka_reader_rebalances_total", float64(s.Rebalances))
		add("idemd_kafka_reader_timeouts_total", float64(s.Timeouts))
		add("idemd_kafka_reader_errors_total", float64(s.Errors))
		add("idemd_kafka_reader_wait_seconds_total", s.WaitTime.Sum.Seconds())
		set("idemd_kafka_reader_queue_length", float64(s.QueueLength))
		set("idemd_kafka_reader_queue_capacity", float64(s.QueueCapacity))
	}, "pipeline", map[string]string{
		"idemd_kafka_reader_dials_total":        "Connections the subscription's Kafka reader opened.",
		"idemd_kafka_reader_fetches_total":      "Fetch requests of the subscription's Kafka reader.",
		"idemd_kafka_reader_messages_total":     "Records the subscription's Kafka reader fetched.",
		"idemd_kafka_reader_bytes_total":        "Bytes of records the subscription's Kafka reader fetched.",
		"idemd_kafka_reader_rebalances_total":   "Consumer group rebalances the subscription's reader went through.",
		"idemd_kafka_reader_timeouts_total":     "Fetches of the subscription's Kafka reader that timed out.",
		"idemd_kafka_reader_errors_total":       "Errors of the subscription's Kafka reader (fetch, commit, group).",
		"idemd_kafka_reader_wait_seconds_total": "Time the subscription's Kafka reader waited for fetched records.",
		"idemd_kafka_reader_queue_length":       "Records fetched and not yet handed to the consumer.",
		"idemd_kafka_reader_queue_capacity":     "Capacity of the reader's queue of fetched records.",
	})
	kafkaWriters = newStatsCollector(func(w WriterStatser, add func(string, float64), _ func(string, float64)) {
		s := w.Stats()
		add("idemd_kafka_writer_writes_total", float64(s.Writes))
		add("idemd_kafka_writer_messages_total", float64(s.Messages))
		add("idemd_kafka_writer_bytes_total", float64(s.Bytes))
		add("idemd_kafka_writer_errors_total", float64(s.Errors))
		add("idemd_kafka_writer_retries_total", float64(s.Retries))
		add("idemd_kafka_writer_write_seconds_total", s.WriteTime.Sum.Seconds())
		add("idemd_kafka_writer_batches_total", float64(s.BatchTime.Count))
	}, "client", map[string]string{
		"idemd_kafka_writer_writes_total":        "Produce requests of the Kafka writer.",
		"idemd_kafka_writer_messages_total":      "Records the Kafka writer produced.",
		"idemd_kafka_writer_bytes_total":         "Bytes of records the Kafka writer produced.",
		"idemd_kafka_writer_errors_total":        "Failed produce requests of the Kafka writer.",
		"idemd_kafka_writer_retries_total":       "Produce retries of the Kafka writer.",
		"idemd_kafka_writer_write_seconds_total": "Time spent in produce requests (divide its rate by the writes' rate for the mean).",
		"idemd_kafka_writer_batches_total":       "Record batches the Kafka writer sent.",
	})
)

// WatchKafkaReader exports r's statistics, labelled pipeline, until stop is called. Stop
// deletes the series: a stopped subscription exports nothing.
func WatchKafkaReader(pipeline string, r ReaderStatser) (stop func()) {
	return kafkaReaders.watch(pipeline, r)
}

// WatchKafkaWriter exports w's statistics, labelled client (e.g. "relay"), until stop is
// called.
func WatchKafkaWriter(client string, w WriterStatser) (stop func()) {
	return kafkaWriters.watch(client, w)
}

// statsCollector turns kafka-go's snapshot statistics into Prometheus series, one label
// value per watched source.
type statsCollector[S comparable] struct {
	mu       sync.Mutex
	read     func(s S, add, set func(name string, v float64))
	counters map[string]*prometheus.CounterVec
	gauges   map[string]*prometheus.GaugeVec
	sources  map[string]S
}

func newStatsCollector[S comparable](read func(s S, add, set func(string, float64)), label string, help map[string]string) *statsCollector[S] {
	c := &statsCollector[S]{
		read: read, sources: map[string]S{},
		counters: map[string]*prometheus.CounterVec{}, gauges: map[string]*prometheus.GaugeVec{},
	}
	for name, h := range help {
		if isCounter(name) {
			c.counters[name] = prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: h}, []string{label})
		} else {
			c.gauges[name] = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: h}, []string{label})
		}
	}
	return c
}

func isCounter(name string) bool { return strings.HasSuffix(name, "_total") }

func (c *statsCollector[S]) watch(label string, s S) func() {
	c.mu.Lock()
	c.sources[label] = s
	c.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.sources[label] != s {
				return // replaced by a newer source of the same name
			}
			delete(c.sources, label)
			for _, v := range c.counters {
				v.DeleteLabelValues(label)
			}
			for _, v := range c.gauges {
				v.DeleteLabelValues(label)
			}
		})
	}
}

func (c *statsCollector[S]) Describe(ch chan<- *prometheus.Desc) {
	for _, v := range c.counters {
		v.Describe(ch)
	}
	for _, v := range c.gauges {
		v.Describe(ch)
	}
}

func (c *statsCollector[S]) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for label, s := range c.sources {
		c.read(s,
			func(name string, v float64) { c.counters[name].WithLabelValues(label).Add(max(v, 0)) },
			func(name string, v float64) { c.gauges[name].WithLabelValues(label).Set(v) })
	}
	for _, v := range c.counters {
		v.Collect(ch)
	}
	for _, v := range c.gauges {
		v.Collect(ch)
	}
}

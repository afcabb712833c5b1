package metrics

import (
	"strconv"
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
	}, []string{"pipeline", "topic", "partition"}, map[string]string{
		"idemd_kafka_reader_dials_total":        "Connections the subscription's partition reader opened.",
		"idemd_kafka_reader_fetches_total":      "Fetch requests of the subscription's partition reader.",
		"idemd_kafka_reader_messages_total":     "Records the subscription's partition reader fetched.",
		"idemd_kafka_reader_bytes_total":        "Bytes of records the subscription's partition reader fetched.",
		"idemd_kafka_reader_rebalances_total":   "Consumer group rebalances the subscription's partition reader went through.",
		"idemd_kafka_reader_timeouts_total":     "Fetches of the subscription's partition reader that timed out.",
		"idemd_kafka_reader_errors_total":       "Errors of the subscription's partition reader (fetch, commit, group).",
		"idemd_kafka_reader_wait_seconds_total": "Time the subscription's partition reader waited for fetched records.",
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
	}, []string{"client"}, map[string]string{
		"idemd_kafka_writer_writes_total":        "Produce requests of the Kafka writer.",
		"idemd_kafka_writer_messages_total":      "Records the Kafka writer produced.",
		"idemd_kafka_writer_bytes_total":         "Bytes of records the Kafka writer produced.",
		"idemd_kafka_writer_errors_total":        "Failed produce requests of the Kafka writer.",
		"idemd_kafka_writer_retries_total":       "Produce retries of the Kafka writer.",
		"idemd_kafka_writer_write_seconds_total": "Time spent in produce requests (divide its rate by the writes' rate for the mean).",
		"idemd_kafka_writer_batches_total":       "Record batches the Kafka writer sent.",
	})
)

// WatchKafkaReader exports the statistics of r, the reader of one partition of a
// subscription, labelled pipeline, topic and partition (as idemd_consumer_lag is), until
// stop is called. Stop deletes the series: a stopped reader exports nothing.
func WatchKafkaReader(pipeline, topic string, partition int, r ReaderStatser) (stop func()) {
	return kafkaReaders.watch(r, pipeline, topic, strconv.Itoa(partition))
}

// WatchKafkaWriter exports w's statistics, labelled client (e.g. "relay"), until stop is
// called.
func WatchKafkaWriter(client string, w WriterStatser) (stop func()) {
	return kafkaWriters.watch(w, client)
}

// statsCollector turns kafka-go's snapshot statistics into Prometheus series, one set of
// label values per watched source.
type statsCollector[S comparable] struct {
	mu       sync.Mutex
	read     func(s S, add, set func(name string, v float64))
	counters map[string]*prometheus.CounterVec
	gauges   map[string]*prometheus.GaugeVec
	sources  map[string]watched[S] // by the label values joined with labelSep
}

// watched is a source and the label values of its series.
type watched[S comparable] struct {
	s      S
	labels []string
}

// labelSep joins label values into a key of sources; Prometheus label values are UTF-8,
// which never holds the byte 0xff.
const labelSep = "\xff"

func newStatsCollector[S comparable](read func(s S, add, set func(string, float64)), labels []string, help map[string]string) *statsCollector[S] {
	c := &statsCollector[S]{
		read: read, sources: map[string]watched[S]{},
		counters: map[string]*prometheus.CounterVec{}, gauges: map[string]*prometheus.GaugeVec{},
	}
	for name, h := range help {
		if isCounter(name) {
			c.counters[name] = prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: h}, labels)
		} else {
			c.gauges[name] = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: h}, labels)
		}
	}
	return c
}

func isCounter(name string) bool { return strings.HasSuffix(name, "_total") }

func (c *statsCollector[S]) watch(s S, labels ...string) func() {
	key := strings.Join(labels, labelSep)
	c.mu.Lock()
	c.sources[key] = watched[S]{s: s, labels: labels}
	c.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.sources[key].s != s {
				return // replaced by a newer source of the same labels
			}
			delete(c.sources, key)
			for _, v := range c.counters {
				v.DeleteLabelValues(labels...)
			}
			for _, v := range c.gauges {
				v.DeleteLabelValues(labels...)
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
	for _, w := range c.sources {
		c.read(w.s,
			func(name string, v float64) { c.counters[name].WithLabelValues(w.labels...).Add(max(v, 0)) },
			func(name string, v float64) { c.gauges[name].WithLabelValues(w.labels...).Set(v) })
	}
	for _, v := range c.counters {
		v.Collect(ch)
	}
	for _, v := range c.gauges {
		v.Collect(ch)
	}
}

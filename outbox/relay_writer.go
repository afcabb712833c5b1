package outbox

import (
	"context"

	"github.com/segmentio/kafka-go"
)

// kafkaWriterTiers are the BatchSizes of the relay's Kafka writers below its largest, which
// holds a whole round (RelayConfig.BatchSize): each twice the one before, so that a round
// gets a buffer of less than twice its records a partition.
var kafkaWriterTiers = []int{64, 128, 256, 512, 1024, 2048}

// tieredWriter is the relay's Kafka writer when the relay builds it (from Brokers):
// kafka-go Writers that differ only in BatchSize, on one Transport, so one set of
// connections and one metadata cache.
//
// kafka-go gives every partition's batch of a WriteMessages call a buffer of its Writer's
// whole BatchSize (152 bytes a record, zeroed), however few records the batch holds. One
// Writer sized for the largest round (4,000 rows, 608 KB a partition) spent that on rounds
// of a few hundred rows, and on the few rows a round of a quiet receiver holds: a fifth of
// the bytes the consumer's process allocated (BENCHMARKS.md, phase 23). A Writer with a
// smaller BatchSize would split a larger round's partition into several produce requests,
// and a later one could land while an earlier one failed, reordering a key. So each
// WriteMessages goes to the smallest Writer whose BatchSize holds all of its records: every
// partition's records still go in one batch, one produce request that the broker takes or
// refuses whole (relayRoundBytes).
type tieredWriter struct {
	ws []*kafka.Writer // by BatchSize, ascending
}

// newTieredWriter builds a Writer with each of kafkaWriterTiers below largest, and one of
// largest, with mk(batchSize).
func newTieredWriter(largest int, mk func(batchSize int) *kafka.Writer) *tieredWriter {
	t := &tieredWriter{}
	for _, n := range kafkaWriterTiers {
		if n < largest {
			t.ws = append(t.ws, mk(n))
		}
	}
	t.ws = append(t.ws, mk(largest))
	return t
}

// writer is the Writer that takes n records: the smallest that holds them all, else the
// largest (a round larger than BatchSize: one transaction's events handed over whole).
func (t *tieredWriter) writer(n int) *kafka.Writer {
	for _, w := range t.ws {
		if n <= w.BatchSize {
			return w
		}
	}
	return t.ws[len(t.ws)-1]
}

// WriteMessages writes msgs with the smallest Writer that holds them all.
func (t *tieredWriter) WriteMessages(ctx context.Context, msgs ...kafka.Message) error {
	return t.writer(len(msgs)).WriteMessages(ctx, msgs...)
}

// Close closes every Writer (the Transport is the relay's to close).
func (t *tieredWriter) Close() error {
	for _, w := range t.ws {
		_ = w.Close() // kafka-go's Close returns nil
	}
	return nil
}

// Stats adds up the Writers' counters since the previous call: the ones idemd exports
// (metrics.WatchKafkaWriter). Each Writer's other figures are its own, and are left out.
func (t *tieredWriter) Stats() kafka.WriterStats {
	var s kafka.WriterStats
	for _, w := range t.ws {
		ws := w.Stats()
		s.Writes += ws.Writes
		s.Messages += ws.Messages
		s.Bytes += ws.Bytes
		s.Errors += ws.Errors
		s.Retries += ws.Retries
		s.WriteTime.Sum += ws.WriteTime.Sum
		s.WriteTime.Count += ws.WriteTime.Count
		s.BatchTime.Sum += ws.BatchTime.Sum
		s.BatchTime.Count += ws.BatchTime.Count
	}
	return s
}

// kafkaWriter is the relay's kafka-go Writer to reach the cluster with (its address and
// transport), nil when its Writer is not kafka-go's.
func (r *Relay) kafkaWriter() *kafka.Writer {
	switch w := r.writer.(type) {
	case *kafka.Writer:
		return w
	case *tieredWriter:
		return w.ws[0]
	}
	return nil
}

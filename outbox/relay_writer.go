package outbox

import (
	"context"
	"net"
	"slices"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol/metadata"
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
// WriteMessages goes to the smallest Writer whose BatchSize holds all of the records that
// go to any one partition: every partition's records still go in one batch, one produce
// request that the broker takes or refuses whole (relayRoundBytes).
//
// To know how many records go to a partition before the write, the tieredWriter assigns
// each record's partition itself (assign), as the Writers' murmur2 balancer would, from the
// partition count their metadata cache holds; its Writers' balancer (assigned) then keeps
// that partition. A topic's partitions are only ever added to, so if the count grows
// between the two, the round still goes to the partitions it was counted for, one batch
// each. (Until phase 37 the Writer was chosen by the round's total for want of this: a
// buffer about as many times too large as the topic has partitions.)
type tieredWriter struct {
	ws []*kafka.Writer // by BatchSize, ascending
	// partitions is how many partitions a topic has, as the Writers read it; nil: each
	// write goes to the smallest Writer that holds all of its records, balanced by the
	// Writers.
	partitions func(ctx context.Context, topic string) (int, error)
}

// newTieredWriter builds a Writer with each of kafkaWriterTiers below largest, and one of
// largest, with mk(batchSize), and sets each one's Balancer to assigned (see tieredWriter).
func newTieredWriter(largest int, partitions func(ctx context.Context, topic string) (int, error), mk func(batchSize int) *kafka.Writer) *tieredWriter {
	t := &tieredWriter{partitions: partitions}
	add := func(n int) {
		w := mk(n)
		w.Balancer = assigned{}
		t.ws = append(t.ws, w)
	}
	for _, n := range kafkaWriterTiers {
		if n < largest {
			add(n)
		}
	}
	add(largest)
	return t
}

// writer is the Writer that takes n records to a partition: the smallest that holds them
// all, else the largest (a round larger than BatchSize: one transaction's events handed
// over whole).
func (t *tieredWriter) writer(n int) *kafka.Writer {
	for _, w := range t.ws {
		if n <= w.BatchSize {
			return w
		}
	}
	return t.ws[len(t.ws)-1]
}

// WriteMessages writes msgs with the smallest Writer that holds all of the records of any
// one partition. It sets each record's Partition (msgs is the caller's, the relay's own).
// The partition counts it assigned them by go to its Writers in ctx (countedTransport).
func (t *tieredWriter) WriteMessages(ctx context.Context, msgs ...kafka.Message) error {
	most, counts := t.assign(ctx, msgs)
	if len(counts) > 0 {
		ctx = context.WithValue(ctx, countedKey{}, counts)
	}
	return t.writer(most).WriteMessages(ctx, msgs...)
}

// countedKey is the context key of the partition counts a tieredWriter's WriteMessages
// assigned its records by: a counted.
type countedKey struct{}

// counted are, for each topic of a WriteMessages call whose partitions assign counted, a
// metadata response that holds that topic with that many partitions.
type counted []*metadata.Response

// countedResponse is the metadata response of topic with n partitions, as kafka-go's
// Writer reads it (the number of partitions, not their leaders).
func countedResponse(topic string, n int) *metadata.Response {
	return &metadata.Response{Topics: []metadata.ResponseTopic{{Name: topic, Partitions: make([]metadata.ResponsePartition, n)}}}
}

// countedTransport is the transport of a tieredWriter's Writers. kafka-go's Writer asks
// its transport for the partition count of a record's topic once for every record of a
// WriteMessages call (Writer.partitions: a metadata request, which kafka.Transport answers
// from its cache with a copy of the cached response). Within a tieredWriter's call, the
// count its assign read for the call answers instead: the same count, read once a topic a
// call. Every other request goes to the transport.
type countedTransport struct{ kafka.RoundTripper }

func (c countedTransport) RoundTrip(ctx context.Context, addr net.Addr, req kafka.Request) (kafka.Response, error) {
	if m, ok := req.(*metadata.Request); ok && len(m.TopicNames) == 1 {
		if cs, ok := ctx.Value(countedKey{}).(counted); ok {
			for _, r := range cs {
				if r.Topics[0].Name == m.TopicNames[0] {
					return r, nil
				}
			}
		}
	}
	return c.RoundTripper.RoundTrip(ctx, addr, req)
}

// unassigned is the Partition of a record that assigned balances itself.
const unassigned = -1

// partitionList is [0, 1, …]: the partitions a balancer is given (kafka-go's Writer gives
// the same).
var partitionList = func() []int {
	l := make([]int, 256)
	for i := range l {
		l[i] = i
	}
	return l
}()

// assign gives each record of msgs its partition as the Writers' murmur2 balancer would,
// over the partitions its topic has now, and returns the most records a partition gets and
// the counts it read. When a topic's partition count cannot be read (an unknown topic, no
// partitions func), it leaves every record unassigned and returns len(msgs) and no counts:
// the Writers balance them and report the error, and the write goes to the Writer that
// holds them all.
func (t *tieredWriter) assign(ctx context.Context, msgs []kafka.Message) (int, counted) {
	for i := range msgs {
		msgs[i].Partition = unassigned
	}
	if t.partitions == nil || len(msgs) == 0 {
		return len(msgs), nil
	}
	// The relay writes one topic a call; a call of several counts each apart.
	type topicCounts struct {
		name   string
		parts  []int
		counts []int
	}
	var (
		topics []topicCounts
		most   int
		bal    kafka.Murmur2Balancer
	)
	k := -1
	for i := range msgs {
		if k < 0 || topics[k].name != msgs[i].Topic {
			k = slices.IndexFunc(topics, func(tc topicCounts) bool { return tc.name == msgs[i].Topic })
		}
		if k < 0 {
			n, err := t.partitions(ctx, msgs[i].Topic)
			if err != nil || n <= 0 {
				for j := range msgs[:i] {
					msgs[j].Partition = unassigned
				}
				return len(msgs), nil
			}
			parts := partitionList
			if n > len(parts) {
				parts = make([]int, n)
				for j := range parts {
					parts[j] = j
				}
			}
			topics = append(topics, topicCounts{name: msgs[i].Topic, parts: parts[:n], counts: make([]int, n)})
			k = len(topics) - 1
		}
		tc := &topics[k]
		p := bal.Balance(msgs[i], tc.parts...)
		msgs[i].Partition = p
		tc.counts[p]++
		most = max(most, tc.counts[p])
	}
	cs := make(counted, len(topics))
	for i, tc := range topics {
		cs[i] = countedResponse(tc.name, len(tc.parts))
	}
	return most, cs
}

// cachedPartitions reads a topic's partition count as kafka-go's Writer does before it
// balances each record: a metadata request to transport, which answers it from its cache
// of the cluster's metadata (refreshed in the background), without a round trip.
func cachedPartitions(transport kafka.RoundTripper, addr net.Addr) func(ctx context.Context, topic string) (int, error) {
	return func(ctx context.Context, topic string) (int, error) {
		r, err := transport.RoundTrip(ctx, addr, &metadata.Request{TopicNames: []string{topic}})
		if err != nil {
			return 0, err
		}
		for _, t := range r.(*metadata.Response).Topics {
			if t.Name == topic {
				if t.ErrorCode != 0 {
					return 0, kafka.Error(t.ErrorCode)
				}
				return len(t.Partitions), nil
			}
		}
		return 0, kafka.UnknownTopicOrPartition
	}
}

// assigned is the tieredWriter's Writers' balancer: a record goes to the partition assign
// gave it, which its topic still has (partitions are only added); a record assign left
// unassigned is balanced by murmur2, as the Writers would without it.
type assigned struct{ murmur2 kafka.Murmur2Balancer }

func (b assigned) Balance(msg kafka.Message, partitions ...int) int {
	if msg.Partition >= 0 && msg.Partition < len(partitions) {
		return partitions[msg.Partition]
	}
	return b.murmur2.Balance(msg, partitions...)
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

package outbox

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol/metadata"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/kafkatest"
)

// TestTieredWriterTakesTheSmallestThatHoldsAWrite: a write goes to the smallest Writer
// whose BatchSize holds all of its records, a write larger than every BatchSize to the
// largest; tiers at or above the largest are left out.
func TestTieredWriterTakesTheSmallestThatHoldsAWrite(t *testing.T) {
	mk := func(n int) *kafka.Writer { return &kafka.Writer{BatchSize: n} }
	w := newTieredWriter(4000, nil, mk)
	for n, want := range map[int]int{1: 64, 64: 64, 65: 128, 1000: 1024, 1025: 2048, 2048: 2048, 2049: 4000, 4000: 4000, 9000: 4000} {
		require.Equal(t, want, w.writer(n).BatchSize, "a write of %d records", n)
	}
	small := newTieredWriter(500, nil, mk)
	require.Len(t, small.ws, 4)
	require.Equal(t, 500, small.writer(257).BatchSize)
	require.Equal(t, 500, small.writer(501).BatchSize)
	require.Equal(t, 64, newTieredWriter(64, nil, mk).writer(1).BatchSize)
	require.Len(t, newTieredWriter(64, nil, mk).ws, 1)
}

// tieredOn is the relay's tieredWriter on the shared broker, its partition counts read by
// partitions (the transport's cache when nil).
func tieredOn(t *testing.T, partitions func(context.Context, string) (int, error)) *tieredWriter {
	w, _ := tieredCounting(t, partitions)
	return w
}

// metadataCounter is a transport that counts the metadata requests for one topic that
// reach it.
type metadataCounter struct {
	kafka.RoundTripper
	topicReads atomic.Int64
}

func (c *metadataCounter) RoundTrip(ctx context.Context, addr net.Addr, req kafka.Request) (kafka.Response, error) {
	if m, ok := req.(*metadata.Request); ok && len(m.TopicNames) == 1 {
		c.topicReads.Add(1)
	}
	return c.RoundTripper.RoundTrip(ctx, addr, req)
}

// tieredCounting is tieredOn, and the transport under its Writers and its counts.
func tieredCounting(t *testing.T, partitions func(context.Context, string) (int, error)) (*tieredWriter, *metadataCounter) {
	t.Helper()
	transport := &kafka.Transport{}
	counter := &metadataCounter{RoundTripper: transport}
	addr := kafka.TCP(kafkatest.Brokers(t)...)
	if partitions == nil {
		partitions = cachedPartitions(counter, addr)
	}
	w := newTieredWriter(4000, partitions, func(n int) *kafka.Writer {
		return &kafka.Writer{Addr: addr, Transport: countedTransport{counter}, BatchSize: n, BatchBytes: 64 << 20, BatchTimeout: time.Microsecond, RequiredAcks: kafka.RequireAll, MaxAttempts: 1}
	})
	t.Cleanup(func() { _ = w.Close(); transport.CloseIdleConnections() })
	return w, counter
}

// TestTieredWriterReadsACountOnceAWrite: kafka-go's Writer reads its topic's partition
// count for every record; a tieredWriter's Writers are answered with the count its assign
// read, so a write of 600 records over two topics reads each topic's count once. A topic
// whose count cannot be read is left to the transport, as before.
func TestTieredWriterReadsACountOnceAWrite(t *testing.T) {
	t.Parallel()
	const parts, n = 6, 600
	a, b := kafkatest.Topic(t, parts), kafkatest.Topic(t, parts)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w, counter := tieredCounting(t, nil)
	msgs := append(keyed(a, "", n/2), keyed(b, "", n/2)...)
	require.NoError(t, w.WriteMessages(ctx, msgs...))
	require.Equal(t, int64(2), counter.topicReads.Load(), "one read of each topic's count")
	for i := range 3 {
		require.NoError(t, w.WriteMessages(ctx, keyed(a, strconv.Itoa(i)+"-", n)...))
	}
	require.Equal(t, int64(5), counter.topicReads.Load(), "one read a write")
	require.Len(t, kafkatest.ReadAll(t, a, n/2+3*n, 30*time.Second), n/2+3*n)

	unknown, counter := tieredCounting(t, func(context.Context, string) (int, error) { return 0, kafka.UnknownTopicOrPartition })
	require.NoError(t, unknown.WriteMessages(ctx, keyed(b, "u-", 10)...))
	require.Equal(t, int64(10), counter.topicReads.Load(), "no count: the Writer reads the transport's for every record")
}

// keyed are n records of topic with distinct keys, in order, their values tag and their
// index.
func keyed(topic, tag string, n int) []kafka.Message {
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		msgs[i] = kafka.Message{Topic: topic, Key: []byte(fmt.Sprintf("key-%04d", i)), Value: []byte(tag + strconv.Itoa(i))}
	}
	return msgs
}

// murmur2 is the partition Java's partitioner gives m over parts partitions.
func murmur2(m kafka.Message, parts int) int {
	return kafka.Murmur2Balancer{}.Balance(m, partitionList[:parts]...)
}

// writesOf are the produce requests each of w's Writers made since the last call.
func writesOf(w *tieredWriter) map[int]int64 {
	out := map[int]int64{}
	for _, x := range w.ws {
		if s := x.Stats(); s.Writes > 0 {
			out[x.BatchSize] = s.Writes
		}
	}
	return out
}

// TestTieredWriterChoosesByTheLargestPartition: a write's records go to the partitions
// Java's murmur2 partitioner gives over the topic's partitions, with the smallest Writer
// that holds the records of its largest partition, one produce request a partition. So a
// round of 600 records over six partitions takes a Writer of 128 or 256, where the round's
// total would have taken 1,024.
func TestTieredWriterChoosesByTheLargestPartition(t *testing.T) {
	t.Parallel()
	const parts, n = 6, 600
	topic := kafkatest.Topic(t, parts)
	w := tieredOn(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, w.WriteMessages(ctx, keyed(topic, "", n)...))
	perPartition := make([]int, parts)
	for _, m := range keyed(topic, "", n) {
		perPartition[murmur2(m, parts)]++
	}
	most := slices.Max(perPartition)
	tier := w.writer(most).BatchSize
	require.Less(t, tier, 512, "the largest partition holds %d records", most)
	require.Equal(t, map[int]int64{tier: parts}, writesOf(w), "one produce request a partition, by the Writer of the largest partition")
	records := kafkatest.ReadAll(t, topic, n, 30*time.Second)
	require.Len(t, records, n)
	for _, r := range records {
		require.Equal(t, murmur2(r, parts), r.Partition, "record %s", r.Key)
	}
}

// TestTieredWriterKeepsTheCountedPartitions: partitions are only ever added to a topic. When
// they grow between the count a write was assigned by and the Writer's balancing (the count
// below says 3 of the topic's 6), the records go to the partitions they were counted for,
// one produce request each: the Writer chosen for the largest of them is never given more
// records for one partition than it holds. A count that cannot be read leaves the records to
// the Writers' murmur2 over the topic's partitions, with the Writer that holds the whole
// write.
func TestTieredWriterKeepsTheCountedPartitions(t *testing.T) {
	t.Parallel()
	const parts, n = 6, 600
	topic := kafkatest.Topic(t, parts)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	fewer := tieredOn(t, func(context.Context, string) (int, error) { return 3, nil })
	require.NoError(t, fewer.WriteMessages(ctx, keyed(topic, "a-", n)...))
	perPartition := make([]int, 3)
	for _, m := range keyed(topic, "a-", n) {
		perPartition[murmur2(m, 3)]++
	}
	tier := fewer.writer(slices.Max(perPartition)).BatchSize
	require.Less(t, tier, n)
	require.Equal(t, map[int]int64{tier: 3}, writesOf(fewer), "one produce request for each of the 3 partitions counted")

	unknown := tieredOn(t, func(context.Context, string) (int, error) { return 0, kafka.UnknownTopicOrPartition })
	msgs := keyed(topic, "b-", n)
	require.NoError(t, unknown.WriteMessages(ctx, msgs...))
	for _, m := range msgs {
		require.Equal(t, unassigned, m.Partition)
	}
	require.Equal(t, map[int]int64{1024: parts}, writesOf(unknown), "the Writer that holds the whole write, balanced by murmur2 over the topic's partitions")

	records := kafkatest.ReadAll(t, topic, 2*n, 30*time.Second)
	require.Len(t, records, 2*n)
	for _, r := range records {
		if strings.HasPrefix(string(r.Value), "a-") {
			require.Equal(t, murmur2(r, 3), r.Partition, "record %s of the write counted over 3 partitions", r.Key)
		} else {
			require.Equal(t, murmur2(r, parts), r.Partition, "record %s of the write left to the Writers", r.Key)
		}
	}
}

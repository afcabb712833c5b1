package consumer

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/kafkatest"
)

// BenchmarkPartitionReader reads a partition's backlog of 20,000 records (the bench's
// payloads) with a kafka-go Reader set as the door sets its partition readers, through
// kafka-go's dialer as it is and through FetchDialer. reads/record, the read(2) calls of
// its connections per record, is the figure: exact, where the time per op is mostly the
// reader waiting for its fetches (its CPU is a tenth of the wall time here, much of it the
// in-process broker's, kfake).
func BenchmarkPartitionReader(b *testing.B) {
	const n = 20000
	brokers := kafkatest.Brokers(b)
	topic := kafkatest.Topic(b, 1)
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, BatchSize: 1000, BatchBytes: 10 << 20, BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireAll}
	recs := benchRecords(n)
	for i := range recs {
		recs[i].Topic, recs[i].Partition, recs[i].Offset = "", 0, 0
	}
	require.NoError(b, w.WriteMessages(b.Context(), recs...))
	require.NoError(b, w.Close())

	for _, buffered := range []bool{false, true} {
		name := "buffer=off"
		if buffered {
			name = "buffer=on"
		}
		b.Run(name, func(b *testing.B) {
			var reads atomic.Int64
			d := &kafka.Dialer{Timeout: 10 * time.Second, DialFunc: func(ctx context.Context, network, address string) (net.Conn, error) {
				c, err := (&net.Dialer{}).DialContext(ctx, network, address)
				if err != nil {
					return nil, err
				}
				return countingConn{Conn: c, reads: &reads}, nil
			}}
			if buffered {
				d = FetchDialer(d)
			}
			for b.Loop() {
				r := kafka.NewReader(kafka.ReaderConfig{
					Brokers: brokers, Topic: topic, Partition: 0, MinBytes: 1, MaxBytes: 10 << 20,
					MaxWait: FetchMaxWaitDefault + FetchAnswerMargin, QueueCapacity: BatchSizeDefault,
					ReadLagInterval: -1, Dialer: d,
				})
				for i := range n {
					m, err := r.ReadMessage(b.Context())
					require.NoError(b, err)
					if m.Offset != int64(i) {
						b.Fatalf("offset %d, want %d", m.Offset, i)
					}
				}
				require.NoError(b, r.Close())
			}
			b.ReportMetric(float64(reads.Load())/float64(b.N*n), "reads/record")
		})
	}
}

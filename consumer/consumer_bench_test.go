package consumer_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/consumer"
	"github.com/idemd/idemd/internal/kafkatest"
)

// BenchmarkThroughput consumes the same topic three ways, in the same run:
//   - exactly_once: this package (claims, effect, offsets after commit), batches of 500;
//   - baseline: the same SQL effect batched directly through pgx, one transaction per
//     partition batch of 500, with no dedup (at-least-once);
//   - one_tx_per_message: this package with BatchSize 1.
//
// It reports messages per second of each and the ratios exactly_once/baseline and
// exactly_once/one_tx_per_message.
func BenchmarkThroughput(b *testing.B) {
	const (
		partitions = 4
		n          = 20000
		nSingle    = 2000
		batch      = 500
	)
	bn := setup(b, partitions)
	msgs := make([]kafka.Message, n)
	for i, id := range ids("bench", n) {
		msgs[i] = msg(id, i%partitions, "")
	}
	produce(b, bn.brokers, bn.topic, msgs...)
	single := kafkatest.Topic(b, partitions)
	produce(b, bn.brokers, single, msgs[:nSingle]...)

	reset := func() {
		bn.db.Exec(b, bn.db.Q(`TRUNCATE {schema}.effects, {schema}.processed_messages`))
	}
	var eo, base, one time.Duration
	for b.Loop() {
		reset()
		eo += timeExactlyOnce(b, bn, bn.topic, batch, n)
		reset()
		base += timeBaseline(b, bn, partitions, batch, n)
		reset()
		one += timeExactlyOnce(b, bn, single, 1, nSingle)
	}
	eoRate := float64(n*b.N) / eo.Seconds()
	baseRate := float64(n*b.N) / base.Seconds()
	oneRate := float64(nSingle*b.N) / one.Seconds()
	b.ReportMetric(eoRate, "exactly_once_msgs/s")
	b.ReportMetric(baseRate, "baseline_msgs/s")
	b.ReportMetric(oneRate, "one_tx_per_message_msgs/s")
	b.ReportMetric(eoRate/baseRate, "ratio_vs_baseline")
	b.ReportMetric(eoRate/oneRate, "ratio_vs_one_tx")
}

// timeExactlyOnce runs a consumer in a new group until it applied want messages of topic.
func timeExactlyOnce(b *testing.B, bn *bundle, topic string, batch, want int) time.Duration {
	cfg := bn.config()
	cfg.Topics, cfg.Group, cfg.BatchSize = []string{topic}, kafkatest.Group(b), batch
	c, err := consumer.New(bn.db.Pool, cfg)
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	begin := time.Now()
	go func() { done <- c.Run(ctx) }()
	bn.until(b, 5*time.Minute, "every message applied", func() bool { return bn.effects(b) >= want })
	elapsed := time.Since(begin)
	cancel()
	require.NoError(b, <-done)
	require.Equal(b, want, bn.effects(b))
	return elapsed
}

// timeBaseline reads each partition directly (no group, no offset commits) and runs the same
// SQL effect batched in one transaction per batch: the cost of the effect without dedup.
func timeBaseline(b *testing.B, bn *bundle, partitions, batch, want int) time.Duration {
	sql := bn.db.Q(effectSQL)
	begin := time.Now()
	var wg sync.WaitGroup
	per := want / partitions
	for p := range partitions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := kafka.NewReader(kafka.ReaderConfig{
				Brokers: bn.brokers, Topic: bn.topic, Partition: p,
				MinBytes: 1, MaxBytes: 10 << 20, MaxWait: 250 * time.Millisecond, QueueCapacity: batch,
			})
			defer r.Close()
			ctx := context.Background()
			for done := 0; done < per; {
				var pb pgx.Batch
				for pb.Len() < batch && done+pb.Len() < per {
					m, err := r.FetchMessage(ctx)
					if err != nil {
						b.Error(err)
						return
					}
					pb.Queue(sql, pgx.NamedArgs{
						"message_id": string(m.Headers[0].Value), "payload": string(m.Value),
						"topic": m.Topic, "partition": m.Partition, "offset": m.Offset,
					})
				}
				err := pgx.BeginFunc(ctx, bn.db.Pool, func(tx pgx.Tx) error {
					return tx.SendBatch(ctx, &pb).Close()
				})
				if err != nil {
					b.Error(err)
					return
				}
				done += pb.Len()
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(begin)
	require.Equal(b, want, bn.effects(b))
	return elapsed
}

package main

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
)

// record is one pre-produced message: its id, its partition and its body.
type record struct {
	id        string
	partition int
	body      []byte
}

// records returns n messages over partitions, every fifth one a repeat (same id, same
// body, same partition, later offset) of an earlier message, as an at-least-once
// producer would send. It also returns how many distinct ids there are.
func records(prefix string, n, partitions int) ([]record, int) {
	rng := rand.New(rand.NewPCG(1, 2))
	out := make([]record, 0, n)
	var fresh []int
	for i := range n {
		if i%5 == 4 && len(fresh) > 0 {
			out = append(out, out[fresh[rng.IntN(len(fresh))]])
			continue
		}
		id := fmt.Sprintf("%s-%08d", prefix, i)
		h := fnv.New32a()
		h.Write([]byte(id))
		out = append(out, record{id: id, partition: int(h.Sum32() % uint32(partitions)), body: eventBody(id, i)})
		fresh = append(fresh, len(out)-1)
	}
	return out, len(fresh)
}

func eventBody(id string, i int) []byte {
	return fmt.Appendf(nil, `{"id":%q,"object":"event","type":"payment_intent.succeeded","created":%d,"data":{"object":{"id":"pi_%06d","object":"payment_intent","amount":%d,"currency":"eur","customer":"cus_%05d"}}}`,
		id, 1700000000+i, i%50000, 100+i%9000, i%997)
}

// byPartition sends each message to the partition it names.
type byPartition struct{}

func (byPartition) Balance(m kafka.Message, _ ...int) int { return m.Partition }

// produce writes recs to topic and returns how many records each partition got.
func (e *env) produce(ctx context.Context, topic string, recs []record, partitions int) ([]int64, error) {
	w := &kafka.Writer{
		Addr: kafka.TCP(e.brokers...), Topic: topic, Balancer: byPartition{},
		BatchSize: 1000, BatchBytes: 16 << 20, BatchTimeout: 5 * time.Millisecond, RequiredAcks: kafka.RequireOne,
	}
	defer w.Close()
	counts := make([]int64, partitions)
	msgs := make([]kafka.Message, 0, 5000)
	flush := func() error {
		if len(msgs) == 0 {
			return nil
		}
		err := w.WriteMessages(ctx, msgs...)
		msgs = msgs[:0]
		return err
	}
	for _, r := range recs {
		counts[r.partition]++
		msgs = append(msgs, kafka.Message{
			Partition: r.partition, Key: []byte(r.id), Value: r.body,
			Headers: []kafka.Header{{Key: "operation-id", Value: []byte(r.id)}},
		})
		if len(msgs) == cap(msgs) {
			if err := flush(); err != nil {
				return nil, fmt.Errorf("producing to %s: %w", topic, err)
			}
		}
	}
	if err := flush(); err != nil {
		return nil, fmt.Errorf("producing to %s: %w", topic, err)
	}
	return counts, nil
}

// benchLimit runs the consumer's SQL work directly through pgx: per message a dedup
// insert, an effect insert and an outbox insert, batched and one message per transaction,
// with -partitions concurrent workers (the consumer's parallelism).
func benchLimit(ctx context.Context, e *env, res *Results) error {
	for _, mode := range []struct {
		name  string
		n     int
		batch int
	}{
		{fmt.Sprintf("direct pgx, %d msgs/tx", e.o.limitBatch), e.o.messages, e.o.limitBatch},
		{"direct pgx, 1 msg/tx", e.o.messagesOne, 1},
	} {
		if err := e.truncate(ctx); err != nil {
			return err
		}
		recs := make([]record, mode.n)
		for i := range recs {
			id := fmt.Sprintf("limit-%08d", i)
			recs[i] = record{id: id, partition: i % e.o.partitions, body: eventBody(id, i)}
		}
		elapsed, err := e.limit(ctx, recs, mode.batch)
		if err != nil {
			return err
		}
		if n, err := e.count(ctx, "{schema}.effects"); err != nil || n != mode.n {
			return fmt.Errorf("limit wrote %d effects, want %d (%v)", n, mode.n, err)
		}
		rate := float64(mode.n) / elapsed.Seconds()
		e.logf("limit %s: %d msgs in %s: %.0f msgs/s", mode.name, mode.n, elapsed.Round(time.Millisecond), rate)
		r := Row{Section: "limit", Mode: mode.name, Count: mode.n, Seconds: elapsed.Seconds(), Rate: rate, Unit: "msgs/s"}
		if mode.batch == 1 {
			res.LimitOne = &r
		} else {
			res.Limit = &r
		}
	}
	return nil
}

func (e *env) limit(ctx context.Context, recs []record, batch int) (time.Duration, error) {
	q := e.q()
	var (
		dedup = `INSERT INTO ` + q + `.processed_messages (scope, message_id, fingerprint, status, completed_at, expires_at)
VALUES ($1, $2, $3, 'done', now(), now() + interval '7 days') ON CONFLICT DO NOTHING`
		effect = `INSERT INTO ` + q + `.effects (message_id, payload, topic, part, off) VALUES ($1, $2::jsonb, $3, $4, $5)`
		out    = `INSERT INTO ` + q + `.outbox (operation_id, pipeline, causation_id, topic, key, payload) VALUES ($1, $2, $3, $4, $5, $6)`
		fp     = make([]byte, 32)
	)
	workers := e.o.partitions
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	begin := time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []record
			for i := w; i < len(recs); i += workers {
				mine = append(mine, recs[i])
			}
			for len(mine) > 0 {
				part := mine[:min(batch, len(mine))]
				mine = mine[len(part):]
				err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
					var b pgx.Batch
					for i, r := range part {
						b.Queue(dedup, "limit", r.id, fp)
						b.Queue(effect, r.id, r.body, "limit", r.partition, i)
						b.Queue(out, uuid.New(), "limit", r.id, "limit.out", []byte(r.id), r.body)
					}
					b.Queue("SELECT pg_notify($1, '')", "idemd_bench_limit")
					return tx.SendBatch(ctx, &b).Close()
				})
				if err != nil {
					mu.Lock()
					firstErr = cmpErr(firstErr, err)
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return time.Since(begin), firstErr
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// benchConsumer consumes pre-produced topics with the consumer in a child process, batched
// and with one transaction per message, timing each from the child's start until the
// group's committed offsets reach the end of every partition.
func benchConsumer(ctx context.Context, e *env, res *Results) error {
	for _, mode := range []struct {
		name  string
		n     int
		batch int
	}{
		{fmt.Sprintf("exactly-once, BatchSize %d", e.o.batch), e.o.messages, e.o.batch},
		{"exactly-once, BatchSize 1", e.o.messagesOne, 1},
	} {
		if err := e.truncate(ctx); err != nil {
			return err
		}
		topic, err := e.topic(ctx, fmt.Sprintf("consumer%d", mode.batch), e.o.partitions)
		if err != nil {
			return err
		}
		recs, unique := records(fmt.Sprintf("evt-%d", mode.batch), mode.n, e.o.partitions)
		e.logf("producing %d records (%d distinct ids) to %s", mode.n, unique, topic)
		counts, err := e.produce(ctx, topic, recs, e.o.partitions)
		if err != nil {
			return err
		}
		group := "bench-" + e.runID + "-" + fmt.Sprint(mode.batch)
		c, err := e.startChild(ctx, "consumer", childConfig{
			MaxConns: int32(e.o.partitions + 2), Topic: topic, Group: group, OutboxTopic: "bench.ledger",
			Batch: mode.batch, ProfileName: fmt.Sprintf("consumer-batch%d", mode.batch),
		})
		if err != nil {
			return err
		}
		begin := time.Now()
		w, err := e.waitCommitted(ctx, group, topic, counts, 10*time.Minute)
		if err != nil {
			c.kill()
			return err
		}
		rss, err := c.stop()
		if err != nil {
			return err
		}
		effects, err := e.count(ctx, "{schema}.effects")
		if err != nil {
			return err
		}
		outbox, err := e.count(ctx, "{schema}.outbox")
		if err != nil {
			return err
		}
		if effects != unique || outbox != unique {
			return fmt.Errorf("consumer applied %d effects and %d outbox rows for %d distinct ids: not exactly once", effects, outbox, unique)
		}
		// The rate is taken from the first committed offset to the last, so that the group
		// join at start (a fixed cost, not throughput) is left out; the total is noted.
		counted := mode.n - int(w.atFirst)
		window := w.end.Sub(w.first)
		total := w.end.Sub(begin)
		rate := float64(counted) / window.Seconds()
		e.logf("consumer %s: %d msgs in %s after the first commit (%d msgs, %s from start): %.0f msgs/s, peak RSS %.1f MiB",
			mode.name, counted, window.Round(time.Millisecond), mode.n, total.Round(time.Millisecond), rate, rss)
		r := Row{Section: "consumer", Mode: mode.name, Count: counted, Seconds: window.Seconds(), Rate: rate, Unit: "msgs/s",
			PeakRSSMiB: rss, Note: fmt.Sprintf("%d records, %d distinct ids, %d duplicates; each effect and outbox row once; rate from first to last offset commit (all %d from child start: %.0f msgs/s)",
				mode.n, unique, mode.n-unique, mode.n, float64(mode.n)/total.Seconds())}
		if mode.batch == 1 {
			res.ConsumerOne = &r
		} else {
			res.Consumer = &r
		}
	}
	return nil
}

// progress is when a group's commits started and ended.
type progress struct {
	// first is when a committed offset was first seen; atFirst is how many records the
	// commits then covered.
	first   time.Time
	atFirst int64
	end     time.Time
}

// waitCommitted polls the group's committed offsets until every partition's reaches want.
func (e *env) waitCommitted(ctx context.Context, group, topic string, want []int64, timeout time.Duration) (progress, error) {
	var pr progress
	cl := &kafka.Client{Addr: kafka.TCP(e.brokers...), Timeout: 10 * time.Second}
	parts := make([]int, len(want))
	for i := range parts {
		parts[i] = i
	}
	deadline := time.Now().Add(timeout)
	for {
		resp, err := cl.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: parts}})
		now := time.Now()
		if err == nil {
			done, sum := 0, int64(0)
			for _, p := range resp.Topics[topic] {
				if p.Error == nil && p.CommittedOffset > 0 {
					sum += p.CommittedOffset
				}
				if p.Error == nil && p.Partition < len(want) && p.CommittedOffset >= want[p.Partition] {
					done++
				}
			}
			if sum > 0 && pr.first.IsZero() {
				pr.first, pr.atFirst = now, sum
			}
			if done == len(want) {
				pr.end = now
				return pr, nil
			}
		}
		if now.After(deadline) {
			return pr, fmt.Errorf("group %s did not commit every offset of %s within %s (%v)", group, topic, timeout, err)
		}
		select {
		case <-ctx.Done():
			return pr, ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

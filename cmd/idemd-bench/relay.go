package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemd/idemd/outbox"
)

// benchRelay runs the relay in a child process: first it drains a pre-filled outbox
// (throughput), then, still running, it relays events enqueued one per transaction at a
// steady rate while the parent consumes them (commit-to-Kafka latency).
func benchRelay(ctx context.Context, e *env, res *Results) error {
	if err := e.truncate(ctx); err != nil {
		return err
	}
	store := outbox.New(&outbox.Config{Schema: e.schema})
	topic, err := e.topic(ctx, "relay", e.o.partitions)
	if err != nil {
		return err
	}
	e.logf("pre-filling the outbox with %d events", e.o.relayEvents)
	payload := make([]byte, 256)
	for i := range payload {
		payload[i] = 'a' + byte(i%26)
	}
	for done := 0; done < e.o.relayEvents; {
		n := min(1000, e.o.relayEvents-done)
		events := make([]outbox.Event, n)
		for j := range events {
			k := done + j
			events[j] = outbox.Event{Topic: topic, Key: []byte("k" + strconv.Itoa(k%64)), Payload: payload,
				Pipeline: "bench", CausationID: "fill-" + strconv.Itoa(k)}
		}
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			return err
		}
		if err := store.EnqueueTx(ctx, tx, events...); err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		done += n
	}
	if _, err := e.pool.Exec(ctx, "ANALYZE "+e.q()+".outbox"); err != nil {
		return err
	}

	// The latency run's topic exists before the relay starts, as production topics do: a
	// Kafka writer learns new topics only at its next metadata refresh.
	latTopic, err := e.topic(ctx, "latency", e.o.partitions)
	if err != nil {
		return err
	}
	c, err := e.startChild(ctx, "relay", childConfig{MaxConns: 4, RelayBatch: e.o.relayBatch, ProfileName: "relay"})
	if err != nil {
		return err
	}
	defer c.kill()
	begin := time.Now()
	for {
		var pending bool
		if err := e.pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+e.q()+".outbox WHERE published_at IS NULL)").Scan(&pending); err != nil {
			return err
		}
		if !pending {
			break
		}
		if time.Since(begin) > 10*time.Minute {
			return errors.New("the relay did not drain the outbox within 10 minutes")
		}
		time.Sleep(5 * time.Millisecond)
	}
	elapsed := time.Since(begin)
	inKafka, err := e.records(ctx, topic, e.o.partitions)
	if err != nil {
		return err
	}
	if inKafka < int64(e.o.relayEvents) {
		return fmt.Errorf("outbox drained but %s holds %d records, want %d", topic, inKafka, e.o.relayEvents)
	}
	rate := float64(e.o.relayEvents) / elapsed.Seconds()
	e.logf("relay: %d events in %s: %.0f events/s", e.o.relayEvents, elapsed.Round(time.Millisecond), rate)
	thr := Row{Section: "relay", Mode: fmt.Sprintf("drain pre-filled outbox, BatchSize %d", e.o.relayBatch), Count: e.o.relayEvents,
		Seconds: elapsed.Seconds(), Rate: rate, Unit: "events/s", Note: "acks=all; " + publication(e.o.keepPublished)}

	lat, err := e.relayLatency(ctx, store, latTopic)
	if err != nil {
		return err
	}
	rss, err := c.stop()
	if err != nil {
		return err
	}
	thr.PeakRSSMiB, lat.PeakRSSMiB = rss, rss
	res.Relay, res.RelayLatency = &thr, lat
	return nil
}

// records returns how many records topic holds.
func (e *env) records(ctx context.Context, topic string, partitions int) (int64, error) {
	cl := &kafka.Client{Addr: kafka.TCP(e.brokers...), Timeout: 10 * time.Second}
	reqs := make([]kafka.OffsetRequest, partitions)
	for p := range reqs {
		reqs[p] = kafka.LastOffsetOf(p)
	}
	resp, err := cl.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return 0, err
	}
	var n int64
	for _, p := range resp.Topics[topic] {
		if p.Error != nil {
			return 0, p.Error
		}
		n += p.LastOffset
	}
	return n, nil
}

// relayLatency enqueues events one per transaction at -relay-rate for -relay-duration and
// measures, for each, the time from just before its COMMIT until the parent's Kafka reader
// has it.
func (e *env) relayLatency(ctx context.Context, store *outbox.Store, topic string) (*Row, error) {
	total := int(float64(e.o.relayRate) * e.o.relayDuration.Seconds())
	committing := make([]atomic.Int64, total)
	checkpoints := e.checkpoints(ctx)
	lat, stopReaders, err := e.readLatencies(ctx, topic, func(h []kafka.Header, now time.Time) (time.Duration, bool) {
		for _, x := range h {
			if x.Key != outbox.HeaderCausationID {
				continue
			}
			i, err := strconv.Atoi(strings.TrimPrefix(string(x.Value), "lat-"))
			if err != nil || i < 0 || i >= total {
				return 0, false
			}
			return max(time.Duration(now.UnixNano()-committing[i].Load()), 0), true
		}
		return 0, false
	})
	if err != nil {
		return nil, err
	}
	defer stopReaders()

	work := make(chan int, total)
	var (
		swg      sync.WaitGroup
		sendErr  atomic.Value
		interval = time.Second / time.Duration(e.o.relayRate)
	)
	payload := make([]byte, 256)
	for range 6 {
		swg.Add(1)
		go func() {
			defer swg.Done()
			for i := range work {
				tx, err := e.pool.Begin(ctx)
				if err == nil {
					err = store.EnqueueTx(ctx, tx, outbox.Event{Topic: topic, Key: []byte("k" + strconv.Itoa(i%64)),
						Payload: payload, Pipeline: "bench", CausationID: "lat-" + strconv.Itoa(i)})
					if err == nil {
						committing[i].Store(time.Now().UnixNano())
						err = tx.Commit(ctx)
					} else {
						_ = tx.Rollback(ctx)
					}
				}
				if err != nil {
					sendErr.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	begin := time.Now()
	for i := range total {
		if d := time.Until(begin.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		work <- i
	}
	close(work)
	swg.Wait()
	sent := time.Since(begin)
	if v := sendErr.Load(); v != nil {
		return nil, fmt.Errorf("enqueueing latency events: %w", v.(error))
	}
	got := lat.wait(total, 30*time.Second)
	stopReaders()
	if got < total {
		return nil, fmt.Errorf("latency run: %d of %d events reached Kafka within 30 s of the last commit", got, total)
	}
	d := lat.all()
	row := &Row{Section: "relay", Mode: fmt.Sprintf("steady %d events/s, 1 event/tx", e.o.relayRate), Count: total,
		Seconds: sent.Seconds(), Rate: float64(total) / sent.Seconds(), Unit: "events/s",
		P50ms: percentile(d, 0.50), P99ms: percentile(d, 0.99), P999ms: percentile(d, 0.999),
		Note: fmt.Sprintf("latency: just before COMMIT -> read from Kafka by the bench; %d errors of the bench's Kafka readers; %s",
			lat.readerErrors.Load(), e.latencyNote(ctx, checkpoints))}
	e.logf("relay latency at %d events/s: p50 %.1f ms p99 %.1f ms p999 %.1f ms", e.o.relayRate, row.P50ms, row.P99ms, row.P999ms)
	return row, nil
}

// publication says what the relay does with a published row.
func publication(keep bool) string {
	if keep {
		return "rows marked published and kept (-keep-published)"
	}
	return "rows deleted once published"
}

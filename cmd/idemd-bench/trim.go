package main

import (
	"cmp"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemd/idemd/consumer"
	"github.com/idemd/idemd/outbox"
)

// trimmer deletes the records a section no longer needs (Kafka's DeleteRecords), so that
// the in-process broker, which keeps every record in memory, holds a long prune section:
// 48 periods produced about 20 M records, which a full run could not hold beside the
// earlier sections' (BENCHMARKS.md, phase 16). kafka-go has no DeleteRecords; franz-go's
// client, already in the module for kfake, sends it to each partition's leader.
type trimmer struct {
	cl *kgo.Client

	mu  sync.Mutex
	low map[string][]int64 // each topic's partitions' first offsets after the last trim
}

// deleted is how many records of topic the trims deleted (its partitions' first offsets).
func (t *trimmer) deleted(topic string) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var n int64
	for _, o := range t.low[topic] {
		n += o
	}
	return n
}

func newTrimmer(brokers []string) (*trimmer, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return nil, fmt.Errorf("trimming records: %w", err)
	}
	return &trimmer{cl: cl, low: map[string][]int64{}}, nil
}

func (t *trimmer) close() { t.cl.Close() }

// trim deletes topic's records below each partition's offset in below (partitions at 0 are
// left alone).
func (t *trimmer) trim(ctx context.Context, topic string, below []int64) error {
	rt := kmsg.NewDeleteRecordsRequestTopic()
	rt.Topic = topic
	for p, o := range below {
		if o > 0 {
			rp := kmsg.NewDeleteRecordsRequestTopicPartition()
			rp.Partition, rp.Offset = int32(p), o
			rt.Partitions = append(rt.Partitions, rp)
		}
	}
	if len(rt.Partitions) == 0 {
		return nil
	}
	req := kmsg.NewPtrDeleteRecordsRequest()
	req.Topics, req.TimeoutMillis = []kmsg.DeleteRecordsRequestTopic{rt}, 10000
	resp, err := req.RequestWith(ctx, t.cl)
	if err != nil {
		return fmt.Errorf("deleting the records of %s: %w", topic, err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	low := t.low[topic]
	if low == nil {
		low = make([]int64, len(below))
		t.low[topic] = low
	}
	for _, rt := range resp.Topics {
		for _, rp := range rt.Partitions {
			if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
				return fmt.Errorf("deleting the records of %s/%d: %w", rt.Topic, rp.Partition, err)
			}
			if int(rp.Partition) < len(low) {
				low[rp.Partition] = max(low[rp.Partition], rp.LowWatermark)
			}
		}
	}
	return nil
}

// collector reads the causation-id header of every record published to a topic while a
// section runs, as readCausations does at its end, and trims what it has read.
type collector struct {
	e      *env
	topic  string
	trim   *trimmer
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu   sync.Mutex
	ids  map[string]bool
	next []int64 // each partition's next offset to read
	err  error
}

// startCollector reads topic's partitions from their first offset until finish.
func (e *env) startCollector(ctx context.Context, topic string, partitions int, t *trimmer) *collector {
	ctx, cancel := context.WithCancel(ctx)
	c := &collector{e: e, topic: topic, trim: t, cancel: cancel, ids: map[string]bool{}, next: make([]int64, partitions)}
	for p := range partitions {
		c.wg.Go(func() { c.read(ctx, p) })
	}
	c.wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(2 * time.Second):
			}
			c.mu.Lock()
			below := append([]int64(nil), c.next...)
			c.mu.Unlock()
			if err := c.trim.trim(ctx, c.topic, below); err != nil && ctx.Err() == nil {
				c.fail(err)
				return
			}
		}
	})
	return c
}

func (c *collector) read(ctx context.Context, p int) {
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: c.e.brokers, Topic: c.topic, Partition: p, MinBytes: 1, MaxBytes: 10 << 20,
		MaxWait: 100*time.Millisecond + consumer.FetchAnswerMargin, ReadLagInterval: -1})
	defer r.Close() //nolint:errcheck // a reader
	for {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			if ctx.Err() == nil {
				c.fail(fmt.Errorf("reading %s/%d: %w", c.topic, p, err))
			}
			return
		}
		c.mu.Lock()
		for _, h := range m.Headers {
			if h.Key == outbox.HeaderCausationID {
				c.ids[string(h.Value)] = true
			}
		}
		c.next[p] = m.Offset + 1
		c.mu.Unlock()
	}
}

func (c *collector) fail(err error) {
	c.mu.Lock()
	c.err = cmp.Or(c.err, err)
	c.mu.Unlock()
}

// stop stops reading (finish stops too).
func (c *collector) stop() {
	c.cancel()
	c.wg.Wait()
}

// finish reads up to each partition's end, stops, and adds the causation ids read to ids.
func (c *collector) finish(ctx context.Context, ids map[string]bool) error {
	defer c.stop()
	cl := &kafka.Client{Addr: kafka.TCP(c.e.brokers...), Timeout: 10 * time.Second}
	reqs := make([]kafka.OffsetRequest, len(c.next))
	for p := range reqs {
		reqs[p] = kafka.LastOffsetOf(p)
	}
	resp, err := cl.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{c.topic: reqs}})
	if err != nil {
		return err
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		behind := 0
		c.mu.Lock()
		err := c.err
		for _, po := range resp.Topics[c.topic] {
			if po.Error != nil {
				err = cmp.Or(err, po.Error)
			}
			if c.next[po.Partition] < po.LastOffset {
				behind++
			}
		}
		c.mu.Unlock()
		switch {
		case err != nil:
			return err
		case behind == 0:
			c.stop()
			for id := range c.ids {
				ids[id] = true
			}
			return nil
		case time.Now().After(deadline):
			return fmt.Errorf("reading %s: %d partitions not read to their end in 2 min", c.topic, behind)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

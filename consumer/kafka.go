package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/sirupsen/logrus"

	"github.com/idemd/idemd/internal/collect"
	"github.com/idemd/idemd/internal/metrics"
)

// The Kafka door. A consumer group hands out partitions in generations; a generation's
// partitions are dealt out to at most BatchesInFlight workers. A worker reads each of its
// partitions with a reader of its own, applies their records in batches (one transaction
// each; a batch may hold records of several of its partitions, each partition's in
// order), and commits the offsets of a batch's partitions only after its transaction
// committed. A member holding many partitions so holds BatchesInFlight transactions at
// most, not one a partition: on sixteen partitions that cost PostgreSQL a quarter more a
// record, and the process 80-90 MiB more (BENCHMARKS.md, phase 42). Offsets are committed
// with the generation that assigned the partition: once a rebalance ended that generation,
// the coordinator refuses a late commit from its worker (ILLEGAL_GENERATION), so a partition
// that moved to another member can never have its offset moved back by its former owner.

// Run consumes until ctx ends, then drains: it stops fetching, applies the records already
// handed to the workers (within ShutdownTimeout), commits their offsets and leaves the
// group. It returns nil after a clean drain, or the error that stopped it (a failure that is
// neither transient nor attributable to one message, such as a missing table).
//
// A Pub/Sub or SQS subscription is run the same way (brokerrun.go): on ctx's end it stops
// receiving, applies the batches in hand within ShutdownTimeout, acknowledges them, and
// releases what it still holds for redelivery.
func (c *Consumer) Run(ctx context.Context) error {
	if c.cfg.Door() != DoorKafka {
		return c.runBroker(ctx)
	}
	if len(c.cfg.Brokers) == 0 {
		return fmt.Errorf("consumer %s: Brokers is required to run", c.cfg.Name)
	}
	group, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID:                c.cfg.Group,
		Brokers:           c.cfg.Brokers,
		Dialer:            c.cfg.Dialer,
		Topics:            c.cfg.Topics,
		HeartbeatInterval: c.cfg.HeartbeatInterval,
		SessionTimeout:    c.cfg.SessionTimeout,
		RebalanceTimeout:  c.cfg.RebalanceTimeout,
		JoinGroupBackoff:  min(c.cfg.HeartbeatInterval, 5*time.Second),
		StartOffset:       kafka.FirstOffset,
		Logger:            kafka.LoggerFunc(c.log.Debugf),
		ErrorLogger:       kafka.LoggerFunc(c.log.Warnf),
	})
	if err != nil {
		return fmt.Errorf("consumer %s: %w", c.cfg.Name, err)
	}
	c.log.WithField("topics", c.cfg.Topics).WithField("group", c.cfg.Group).Info("consumer started")

	scope := c.newRunScope(ctx)
	defer scope.close()
	for {
		gen, err := group.Next(scope.failed)
		if err != nil {
			if scope.failed.Err() != nil {
				break
			}
			c.log.WithError(err).Warn("error joining the consumer group; retrying")
			continue
		}
		c.startGeneration(scope.failed, scope.work, gen, scope.report)
	}
	// Close waits for the last generation's workers (they drain on ctx), then leaves the
	// group so that its partitions move at once rather than after the session timeout.
	if err := group.Close(); err != nil && scope.err == nil {
		c.log.WithError(err).Warn("error leaving the consumer group")
	}
	if scope.err != nil {
		c.log.WithError(scope.err).Error("consumer stopped")
		return scope.err
	}
	c.log.Info("consumer drained and stopped")
	return nil
}

// startGeneration starts the generation's workers: its partitions are dealt out to at most
// BatchesInFlight workers, each of which reads its partitions and applies their records in
// batches that may span them. Each worker ends when the generation ends (a rebalance) or
// ctx ends (shutdown, failure), after finishing the batch it holds.
func (c *Consumer) startGeneration(ctx, workCtx context.Context, gen *kafka.Generation, fail func(error)) {
	owned := map[partitionKey]bool{}
	held := map[string][]int{}
	var parts []assigned
	for topic, pas := range gen.Assignments {
		for _, p := range pas {
			owned[partitionKey{topic, p.ID}] = true
			held[topic] = append(held[topic], p.ID)
			parts = append(parts, assigned{topic, p})
		}
	}
	c.mu.Lock()
	c.owned = owned
	c.mu.Unlock()
	if c.cfg.OnAssign != nil {
		c.cfg.OnAssign(gen.ID, held)
	}
	gen.Start(func(genCtx context.Context) {
		// The partitions are this member's until the generation ends.
		<-genCtx.Done()
		c.mu.Lock()
		if maps.Equal(c.owned, owned) {
			c.owned = nil
		}
		c.mu.Unlock()
	})
	slices.SortFunc(parts, func(a, b assigned) int {
		return cmp.Or(strings.Compare(a.topic, b.topic), cmp.Compare(a.ID, b.ID))
	})
	workers := collect.Deal(parts, c.cfg.BatchesInFlight)
	for _, w := range workers {
		gen.Start(func(genCtx context.Context) {
			stop, cancel := context.WithCancel(genCtx)
			defer cancel()
			defer context.AfterFunc(ctx, cancel)()
			c.partitions(stop, cancel, workCtx, gen, w, fail)
		})
	}
	c.log.WithField("generation", gen.ID).WithField("partitions", len(parts)).
		WithField("workers", len(workers)).Info("partitions assigned")
}

// assigned is a partition of a generation.
type assigned struct {
	topic string
	kafka.PartitionAssignment
}

// partitions reads its partitions from their assigned offsets until stop ends, applying
// their records in batches (one transaction each, in each partition's order) and
// committing, with gen, the offsets of the partitions each batch holds.
func (c *Consumer) partitions(stop context.Context, halt context.CancelFunc, work context.Context, gen *kafka.Generation, parts []assigned, fail func(error)) {
	log := c.log.WithField("generation", gen.ID)
	in := make(chan *record, c.cfg.BatchSize)
	var fetchers sync.WaitGroup
	for _, p := range parts {
		fetchers.Go(func() { c.fetch(stop, log, p, in) })
	}
	go func() {
		fetchers.Wait()
		close(in)
	}()
	var batch []*record
	for {
		var open bool
		batch, open = collect.Batch(in, c.cfg.BatchSize, c.cfg.Linger, batch[:0])
		if len(batch) > 0 {
			if err := c.process(work, batch); err != nil {
				if work.Err() == nil {
					fail(fmt.Errorf("error applying a batch of %s: %w", batchPartitions(batch), err))
				} else {
					log.WithField("messages", len(batch)).WithField("batch_partitions", batchPartitions(batch)).
						Warn("shutdown timeout: batch rolled back, left for redelivery")
				}
				halt()
				for range in { // let the fetchers finish
				}
				return
			}
			c.commit(work, gen, batch, log)
			clear(batch) // pins no record until the next batch
		}
		if !open {
			return
		}
	}
}

// fetch reads one partition from its assigned offset into in until stop ends.
func (c *Consumer) fetch(stop context.Context, log *logrus.Entry, p assigned, in chan<- *record) {
	log = log.WithFields(logrus.Fields{"topic": p.topic, "partition": p.ID})
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers:         c.cfg.Brokers,
		Topic:           p.topic,
		Partition:       p.ID,
		MinBytes:        1,
		MaxBytes:        10 << 20,
		Dialer:          c.fetchDialer,
		MaxWait:         c.cfg.FetchMaxWait + FetchAnswerMargin,
		QueueCapacity:   c.cfg.BatchSize,
		ReadLagInterval: -1,
		Logger:          kafka.LoggerFunc(log.Debugf),
		ErrorLogger:     kafka.LoggerFunc(log.Warnf),
	})
	defer func() { _ = r.Close() }()
	defer metrics.WatchKafkaReader(c.cfg.Name, p.topic, p.ID, r)()
	if err := r.SetOffset(p.Offset); err != nil {
		log.WithError(err).Warn("error setting the partition's offset")
		return
	}
	received := metrics.Received.WithLabelValues(c.cfg.Name, DoorKafka)
	for {
		m, err := r.FetchMessage(stop)
		if err != nil {
			if stop.Err() != nil {
				return
			}
			log.WithError(err).Warn("error fetching records; retrying")
			select {
			case <-stop.Done():
				return
			case <-time.After(time.Second):
			}
			continue
		}
		received.Inc()
		select {
		case in <- newRecord(c.cfg.Name, m, time.Now()):
		case <-stop.Done(): // not handed over: not committed, redelivered
			return
		}
	}
}

// batchPartitions names the partitions of a batch, for errors and logs: "orders/0,orders/3".
func batchPartitions(batch []*record) string {
	var names []string
	for _, r := range batch {
		name := r.msg.Topic + "/" + strconv.Itoa(r.msg.Partition)
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	return strings.Join(names, ",")
}

// commit commits, with the generation that assigned them, the offsets after the last
// record of each partition in the committed batch. A commit is refused after a rebalance
// (the partition has a new owner, which reads from the last committed offset and
// deduplicates), or lost on the way (the next batch's commit covers it): either is logged,
// neither loses a record.
func (c *Consumer) commit(ctx context.Context, gen *kafka.Generation, batch []*record, log *logrus.Entry) {
	offsets := map[string]map[int]int64{}
	for _, r := range batch { // each partition's records are in order: its last one wins
		if offsets[r.msg.Topic] == nil {
			offsets[r.msg.Topic] = map[int]int64{}
		}
		offsets[r.msg.Topic][r.msg.Partition] = r.msg.Offset + 1
	}
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		if err = gen.CommitOffsets(offsets); err == nil || ctx.Err() != nil || errors.Is(err, kafka.IllegalGeneration) ||
			errors.Is(err, kafka.RebalanceInProgress) || errors.Is(err, kafka.UnknownMemberId) {
			break
		}
	}
	if err != nil {
		log.WithError(err).WithField("batch_partitions", batchPartitions(batch)).Warn("offsets not committed")
		return
	}
	if c.cfg.OnOffsetCommit != nil {
		for topic, parts := range offsets {
			for p, next := range parts {
				c.cfg.OnOffsetCommit(topic, p, next)
			}
		}
	}
}

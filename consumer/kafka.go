package consumer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/sirupsen/logrus"

	"github.com/idemd/idemd/internal/collect"
	"github.com/idemd/idemd/internal/metrics"
)

// The Kafka door. A consumer group hands out partitions in generations; each generation's
// partitions are read by one worker each, which applies its records in batches, in order,
// and commits a batch's offset only after its transaction committed. Offsets are committed
// with the generation that assigned the partition: once a rebalance ended that generation,
// the coordinator refuses a late commit from its worker (ILLEGAL_GENERATION), so a partition
// that moved to another member can never have its offset moved back by its former owner.

// Run consumes until ctx ends, then drains: it stops fetching, applies the records already
// handed to the partitions (within ShutdownTimeout), commits their offsets and leaves the
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

// startGeneration starts one worker per partition the generation assigned. Each ends when
// the generation ends (a rebalance) or ctx ends (shutdown, failure), after finishing the
// batch it holds.
func (c *Consumer) startGeneration(ctx, workCtx context.Context, gen *kafka.Generation, fail func(error)) {
	owned := map[partitionKey]bool{}
	held := map[string][]int{}
	for topic, parts := range gen.Assignments {
		for _, p := range parts {
			owned[partitionKey{topic, p.ID}] = true
			held[topic] = append(held[topic], p.ID)
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
	n := 0
	for topic, parts := range gen.Assignments {
		for _, p := range parts {
			n++
			gen.Start(func(genCtx context.Context) {
				stop, cancel := context.WithCancel(genCtx)
				defer cancel()
				defer context.AfterFunc(ctx, cancel)()
				c.partition(stop, workCtx, gen, topic, p, fail)
			})
		}
	}
	c.log.WithField("generation", gen.ID).WithField("partitions", n).Info("partitions assigned")
}

// partition reads one partition from its assigned offset until stop ends, applying its
// records in batches and committing each batch's offset with gen.
func (c *Consumer) partition(stop, work context.Context, gen *kafka.Generation, topic string, pa kafka.PartitionAssignment, fail func(error)) {
	log := c.log.WithFields(logrus.Fields{"topic": topic, "partition": pa.ID, "generation": gen.ID})
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers:         c.cfg.Brokers,
		Topic:           topic,
		Partition:       pa.ID,
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
	defer metrics.WatchKafkaReader(c.cfg.Name+"/"+topic+"/"+strconv.Itoa(pa.ID), r)()
	if err := r.SetOffset(pa.Offset); err != nil {
		log.WithError(err).Warn("error setting the partition's offset")
		return
	}
	in := make(chan *record, c.cfg.BatchSize)
	received := metrics.Received.WithLabelValues(c.cfg.Name, DoorKafka)
	go func() {
		defer close(in)
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
	}()
	for {
		batch, open := collect.Batch(in, c.cfg.BatchSize, c.cfg.Linger, nil)
		if len(batch) > 0 {
			if err := c.process(work, batch); err != nil {
				if work.Err() == nil {
					fail(fmt.Errorf("error applying a batch of %s/%d: %w", topic, pa.ID, err))
				} else {
					log.WithField("messages", len(batch)).Warn("shutdown timeout: batch rolled back, left for redelivery")
				}
				for range in { // let the fetcher finish
				}
				return
			}
			last := batch[len(batch)-1].raw
			if err := c.commit(work, gen, last); err != nil {
				// Refused after a rebalance (the partition has a new owner, which reads
				// from the last committed offset and deduplicates), or lost on the way (the
				// next batch's commit covers it).
				log.WithError(err).WithField("offset", last.Offset).Warn("offset not committed")
			}
		}
		if !open {
			return
		}
	}
}

// commit commits the offset after last with the generation that assigned its partition.
func (c *Consumer) commit(ctx context.Context, gen *kafka.Generation, last kafka.Message) error {
	offsets := map[string]map[int]int64{last.Topic: {last.Partition: last.Offset + 1}}
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		if err = gen.CommitOffsets(offsets); err == nil || ctx.Err() != nil || errors.Is(err, kafka.IllegalGeneration) ||
			errors.Is(err, kafka.RebalanceInProgress) || errors.Is(err, kafka.UnknownMemberId) {
			break
		}
	}
	if err == nil && c.cfg.OnOffsetCommit != nil {
		c.cfg.OnOffsetCommit(last.Topic, last.Partition, last.Offset+1)
	}
	return err
}

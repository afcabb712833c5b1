// Package consumer is idemd's Kafka door: it consumes at-least-once topics in a consumer
// group and applies each message's effect exactly once per (pipeline, message id).
//
// Guarantee: records are handled in batches per partition, one PostgreSQL transaction per
// batch (internal/exactlyonce): the claims of the batch's ids, the effect of each new one
// (SQL, a Go Handler, an outbox event), and the dead letters commit together or not at all.
// The offsets of a batch are committed only after its transaction committed, so a crash or a
// rebalance at any point leads to redelivery, never to loss, and a redelivered id is
// recognised by its processed row and its effect is not repeated. Nothing that a crash could
// lose lives only in memory. Order within a partition is preserved; partitions run in
// parallel.
package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/sirupsen/logrus"

	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/exactlyonce"
	"github.com/idemd/idemd/internal/fingerprint"
	"github.com/idemd/idemd/internal/metrics"
	"github.com/idemd/idemd/outbox"
	"github.com/idemd/idemd/processed"
)

// Defaults of Config.
const (
	BatchSizeDefault         = 500
	LingerDefault            = 5 * time.Millisecond
	MaxAttemptsDefault       = 5
	ShutdownTimeoutDefault   = 10 * time.Second
	FetchMaxWaitDefault      = 250 * time.Millisecond
	HeartbeatIntervalDefault = 3 * time.Second
	SessionTimeoutDefault    = 30 * time.Second
	RebalanceTimeoutDefault  = 30 * time.Second
	GroupPrefix              = "idemd-"
)

// Config configures a Consumer. It is plain data (plus Handler and hooks), so that a
// subscription of the pipelines file maps onto it.
type Config struct {
	// Name is the pipeline's name; message ids are unique within it. Required.
	Name string
	// Brokers are the Kafka bootstrap addresses. Required.
	Brokers []string
	// Topics are consumed in one consumer group. Required.
	Topics []string
	// Group is the consumer group. Defaults to "idemd-" + Name.
	Group string
	// MessageID says where a record's id is. Defaults to the first present of the headers
	// operation-id, message-id and idempotency-key (DefaultIDHeaders).
	MessageID *Field
	// SQL is the effect run for each new message, with pgx named arguments (Params). It is
	// checked at New: it must prepare. Defaults to none.
	SQL string
	// Handler is a Go effect run for each new message, after SQL, in the same transaction.
	// Defaults to none.
	Handler Handler
	// Publish writes one outbox event per applied message. Defaults to none.
	Publish *Publish
	// Order enables the stale-event guard. Defaults to none (every new id is applied).
	Order *Order
	// DeadLetter says what happens to a message that keeps failing. Defaults to 5 attempts
	// and a dead_letters row only.
	DeadLetter DeadLetter
	// Retention is how long a message id is remembered; after it the id counts as new.
	// Defaults to 7 days (processed.RetentionDefault).
	Retention time.Duration
	// Schema holds idemd's tables. Defaults to "idemd".
	Schema string
	// BatchSize is the most records of one partition in one transaction. Defaults to 500.
	BatchSize int
	// Linger is how long a partition's batch waits for more records once it has one.
	// Defaults to 5 ms.
	Linger time.Duration
	// FetchMaxWait bounds how long a fetch waits on the broker for new records. Defaults to
	// 250 ms.
	FetchMaxWait time.Duration
	// ShutdownTimeout bounds the drain after Run's ctx ends: the batches in hand are
	// applied and their offsets committed within it, or rolled back and left for
	// redelivery. Defaults to 10 s.
	ShutdownTimeout time.Duration
	// HeartbeatInterval, SessionTimeout and RebalanceTimeout tune the consumer group.
	// Default to 3 s, 30 s and 30 s.
	HeartbeatInterval time.Duration
	SessionTimeout    time.Duration
	RebalanceTimeout  time.Duration
	// BackoffMin and BackoffMax bound the waits between retries of transient failures.
	// Default to 50 ms and 5 s.
	BackoffMin time.Duration
	BackoffMax time.Duration
	// Logger receives the consumer's logs. Defaults to logrus's standard logger; the entry
	// gets component=consumer and pipeline fields.
	Logger *logrus.Entry
	// AfterCommit, when set, runs after a batch's transaction committed and before its
	// offset is committed (tests crash there). Defaults to nil.
	AfterCommit func(batch []Message)
}

// Publish writes an outbox event for each applied message: the message's value, on Topic.
type Publish struct {
	// Topic receives the events. Required unless Endpoint is set.
	Topic string `yaml:"topic" json:"topic"`
	// Endpoint names an outbound HTTP endpoint (delivery.Endpoint.Name) that receives the
	// events by POST, beside or instead of Topic. Defaults to none.
	Endpoint string `yaml:"endpoint,omitempty" json:"endpoint,omitempty"`
	// Key says where the record key comes from. Defaults to no key.
	Key *Field `yaml:"key,omitempty" json:"key,omitempty"`
}

// Order configures the stale-event guard: a message whose Version is not greater than the
// last applied version of its Entity is acknowledged, counted, and its effect skipped.
// Versions are decimal numbers, or RFC 3339 timestamps (compared as microseconds since the
// Unix epoch).
type Order struct {
	// Entity says where the entity id is. Required.
	Entity Field `yaml:"entity" json:"entity"`
	// Version says where the entity version is. Required.
	Version Field `yaml:"version" json:"version"`
}

// DeadLetter configures dead-lettering.
type DeadLetter struct {
	// Topic, when set, receives a record (through the outbox) for each dead letter.
	// Defaults to none: a dead_letters row only.
	Topic string `yaml:"topic,omitempty" json:"topic,omitempty"`
	// MaxAttempts is how many times a permanently failing effect is tried. Defaults to 5.
	MaxAttempts int `yaml:"max_attempts,omitempty" json:"max_attempts,omitempty"`
}

// Consumer consumes one subscription. Create it with New, run it with Run.
type Consumer struct {
	cfg      Config
	pool     *pgxpool.Pool
	unit     *exactlyonce.Unit
	outbox   *outbox.Store
	dead     *deadletter.Store
	log      *logrus.Entry
	guardSQL string
	// sql is the SQL effect with positional parameters; sqlParams names them in order.
	sql       string
	sqlParams []string
}

// New checks cfg, fills its defaults, and checks that the SQL effect prepares.
func New(pool *pgxpool.Pool, cfg *Config) (*Consumer, error) {
	if pool == nil {
		return nil, errors.New("consumer: pool is required")
	}
	if cfg == nil {
		return nil, errors.New("consumer: config is required")
	}
	c := *cfg
	c.Group = cmp.Or(c.Group, GroupPrefix+c.Name)
	c.Schema = cmp.Or(c.Schema, processed.SchemaDefault)
	c.BatchSize = cmp.Or(c.BatchSize, BatchSizeDefault)
	c.Linger = cmp.Or(c.Linger, LingerDefault)
	c.FetchMaxWait = cmp.Or(c.FetchMaxWait, FetchMaxWaitDefault)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, ShutdownTimeoutDefault)
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, HeartbeatIntervalDefault)
	c.SessionTimeout = cmp.Or(c.SessionTimeout, SessionTimeoutDefault)
	c.RebalanceTimeout = cmp.Or(c.RebalanceTimeout, RebalanceTimeoutDefault)
	c.DeadLetter.MaxAttempts = cmp.Or(c.DeadLetter.MaxAttempts, MaxAttemptsDefault)
	if c.Logger == nil {
		c.Logger = logrus.NewEntry(logrus.StandardLogger())
	}
	switch {
	case c.Name == "":
		return nil, errors.New("consumer: Name is required")
	case len(c.Brokers) == 0:
		return nil, fmt.Errorf("consumer %s: Brokers is required", c.Name)
	case len(c.Topics) == 0:
		return nil, fmt.Errorf("consumer %s: Topics is required", c.Name)
	case c.BatchSize < 1:
		return nil, fmt.Errorf("consumer %s: BatchSize must be positive, got %d", c.Name, c.BatchSize)
	case c.Linger < 0:
		return nil, fmt.Errorf("consumer %s: Linger must not be negative, got %s", c.Name, c.Linger)
	case c.DeadLetter.MaxAttempts < 1:
		return nil, fmt.Errorf("consumer %s: DeadLetter.MaxAttempts must be positive, got %d", c.Name, c.DeadLetter.MaxAttempts)
	case c.Retention < 0:
		return nil, fmt.Errorf("consumer %s: Retention must not be negative, got %s", c.Name, c.Retention)
	}
	for i, t := range c.Topics {
		if t == "" {
			return nil, fmt.Errorf("consumer %s: Topics[%d] is empty", c.Name, i)
		}
	}
	if c.MessageID != nil {
		if err := c.MessageID.validate(); err != nil {
			return nil, fmt.Errorf("consumer %s: MessageID: %w", c.Name, err)
		}
	}
	if c.Publish != nil {
		if c.Publish.Topic == "" && c.Publish.Endpoint == "" {
			return nil, fmt.Errorf("consumer %s: Publish.Topic or Publish.Endpoint is required", c.Name)
		}
		if c.Publish.Key != nil {
			if err := c.Publish.Key.validate(); err != nil {
				return nil, fmt.Errorf("consumer %s: Publish.Key: %w", c.Name, err)
			}
		}
	}
	if c.Order != nil {
		if err := c.Order.Entity.validate(); err != nil {
			return nil, fmt.Errorf("consumer %s: Order.Entity: %w", c.Name, err)
		}
		if err := c.Order.Version.validate(); err != nil {
			return nil, fmt.Errorf("consumer %s: Order.Version: %w", c.Name, err)
		}
	}
	log := c.Logger.WithField("component", "consumer").WithField("pipeline", c.Name)
	var (
		positional string
		params     []string
	)
	if c.SQL != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var err error
		if positional, params, err = checkSQL(ctx, pool, c.SQL); err != nil {
			return nil, fmt.Errorf("consumer %s: SQL: %w", c.Name, err)
		}
	}
	store, err := processed.New(&processed.Config{Schema: c.Schema, Retention: c.Retention})
	if err != nil {
		return nil, fmt.Errorf("consumer %s: %w", c.Name, err)
	}
	con := &Consumer{
		cfg: c, pool: pool, log: log, sql: positional, sqlParams: params,
		outbox:   outbox.New(&outbox.Config{Schema: c.Schema}),
		dead:     deadletter.New(c.Schema),
		guardSQL: guardSQL(c.Schema),
	}
	con.unit, err = exactlyonce.New(pool, &exactlyonce.Config{
		Processed:  store,
		BackoffMin: c.BackoffMin,
		BackoffMax: c.BackoffMax,
		Logger:     log,
		OnRetry:    func(error) { metrics.Retries.WithLabelValues("kafka").Inc() },
		Flush:      con.flush,
	})
	if err != nil {
		return nil, fmt.Errorf("consumer %s: %w", c.Name, err)
	}
	return con, nil
}

// Name returns the pipeline's name.
func (c *Consumer) Name() string { return c.cfg.Name }

// reader is what the consumer needs of a kafka-go group Reader.
type reader interface {
	FetchMessage(ctx context.Context) (kafka.Message, error)
	CommitMessages(ctx context.Context, msgs ...kafka.Message) error
	Close() error
}

type partitionKey struct {
	topic     string
	partition int
}

// Run consumes until ctx ends, then drains: it stops fetching, applies the records already
// handed to the partitions (within ShutdownTimeout), commits their offsets and leaves the
// group. It returns nil after a clean drain, or the error that stopped it (a failure that is
// neither transient nor attributable to one message, such as a missing table).
func (c *Consumer) Run(ctx context.Context) error {
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers:           c.cfg.Brokers,
		GroupID:           c.cfg.Group,
		GroupTopics:       c.cfg.Topics,
		MinBytes:          1,
		MaxBytes:          10 << 20,
		MaxWait:           c.cfg.FetchMaxWait,
		QueueCapacity:     c.cfg.BatchSize,
		StartOffset:       kafka.FirstOffset,
		HeartbeatInterval: c.cfg.HeartbeatInterval,
		SessionTimeout:    c.cfg.SessionTimeout,
		RebalanceTimeout:  c.cfg.RebalanceTimeout,
		JoinGroupBackoff:  min(c.cfg.HeartbeatInterval, 5*time.Second),
		ReadLagInterval:   -1,
		Logger:            kafka.LoggerFunc(c.log.Debugf),
		ErrorLogger:       kafka.LoggerFunc(c.log.Warnf),
	})
	return c.run(ctx, r)
}

func (c *Consumer) run(ctx context.Context, r reader) error {
	// In-flight work outlives ctx by at most ShutdownTimeout.
	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	stopDrainTimer := context.AfterFunc(ctx, func() { time.AfterFunc(c.cfg.ShutdownTimeout, cancelWork) })
	defer stopDrainTimer()

	fetchCtx, stopFetch := context.WithCancel(ctx)
	defer stopFetch()
	var (
		wg      sync.WaitGroup
		errOnce sync.Once
		runErr  error
		workers = map[partitionKey]chan *record{}
	)
	fail := func(err error) {
		errOnce.Do(func() { runErr = err })
		stopFetch()
	}
	c.log.WithField("topics", c.cfg.Topics).WithField("group", c.cfg.Group).Info("consumer started")
	for fetchCtx.Err() == nil {
		m, err := r.FetchMessage(fetchCtx)
		if err != nil {
			if fetchCtx.Err() != nil {
				break
			}
			c.log.WithError(err).Warn("error fetching records; retrying")
			select {
			case <-fetchCtx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		metrics.Received.WithLabelValues(c.cfg.Name, "kafka").Inc()
		k := partitionKey{m.Topic, m.Partition}
		in, ok := workers[k]
		if !ok {
			in = make(chan *record, c.cfg.BatchSize)
			workers[k] = in
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.work(workCtx, r, k, in, fail)
			}()
		}
		select {
		case in <- newRecord(c.cfg.Name, m, time.Now()):
		case <-fetchCtx.Done():
			// Not handed over: not committed, redelivered.
		}
	}
	for _, in := range workers {
		close(in)
	}
	wg.Wait()
	if err := r.Close(); err != nil && runErr == nil {
		c.log.WithError(err).Warn("error closing the Kafka reader")
	}
	if runErr != nil {
		c.log.WithError(runErr).Error("consumer stopped")
		return runErr
	}
	c.log.Info("consumer drained and stopped")
	return nil
}

// work applies one partition's records in batches, in order, until in is closed.
func (c *Consumer) work(ctx context.Context, r reader, k partitionKey, in <-chan *record, fail func(error)) {
	log := c.log.WithField("topic", k.topic).WithField("partition", k.partition)
	for {
		batch, open := collect(in, c.cfg.BatchSize, c.cfg.Linger)
		if len(batch) > 0 {
			if err := c.process(ctx, batch); err != nil {
				if ctx.Err() == nil {
					fail(fmt.Errorf("error applying a batch of %s/%d: %w", k.topic, k.partition, err))
				} else {
					log.WithField("messages", len(batch)).Warn("shutdown timeout: batch rolled back, left for redelivery")
				}
				for range in { // let the fetch loop finish
				}
				return
			}
			last := batch[len(batch)-1].raw
			if err := c.commit(ctx, r, last); err != nil {
				// The next batch's commit covers these; meanwhile a redelivery is deduped.
				log.WithError(err).WithField("offset", last.Offset).Warn("error committing offset")
			}
		}
		if !open {
			return
		}
	}
}

// collect waits for a first record, then gathers more until size or linger.
func collect(in <-chan *record, size int, linger time.Duration) ([]*record, bool) {
	first, ok := <-in
	if !ok {
		return nil, false
	}
	batch := []*record{first}
	var timer <-chan time.Time
	for len(batch) < size {
		select {
		case r, ok := <-in:
			if !ok {
				return batch, false
			}
			batch = append(batch, r)
			continue
		default:
		}
		if timer == nil {
			t := time.NewTimer(linger)
			defer t.Stop()
			timer = t.C
		}
		select {
		case r, ok := <-in:
			if !ok {
				return batch, false
			}
			batch = append(batch, r)
		case <-timer:
			return batch, true
		}
	}
	return batch, true
}

func (c *Consumer) commit(ctx context.Context, r reader, last kafka.Message) error {
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		if err = r.CommitMessages(ctx, last); err == nil || ctx.Err() != nil {
			return err
		}
	}
	return err
}

// process applies one partition's batch in one transaction and records the outcomes.
func (c *Consumer) process(ctx context.Context, batch []*record) error {
	p := &pending{}
	msgs := make([]*exactlyonce.Message, len(batch))
	for i, r := range batch {
		r.pending = p
		m := &exactlyonce.Message{
			Scope:       c.cfg.Name,
			Fingerprint: fingerprint.Body(r.msg.Value),
			Payload:     r.msg.Value,
			Retention:   c.cfg.Retention,
			Effect:      c.effect,
			MaxAttempts: c.cfg.DeadLetter.MaxAttempts,
			DeadLetter:  c.deadLetter,
			Value:       r,
		}
		id, ok := r.id(c.cfg.MessageID)
		switch {
		case ok && processed.ValidID(id):
			r.msg.ID, m.ID = id, id
		default:
			// Deduplicated by position, so that a redelivery is not dead-lettered twice.
			m.ID = "kafka-position:" + r.msg.Topic + "/" + strconv.Itoa(r.msg.Partition) + "/" + strconv.FormatInt(r.msg.Offset, 10)
			m.Effect, m.MaxAttempts = noID, 1
			if ok {
				// Too long, not UTF-8, control characters: not storable as an id.
				m.Effect = malformedID
			}
		}
		msgs[i] = m
	}
	start := time.Now()
	todo := msgs
	for wait := c.cfg.BackoffMin; ; {
		if err := c.unit.Apply(ctx, todo); err != nil {
			return err
		}
		// A live reservation (never made by this door, but possible in a shared scope)
		// holds some ids: try those again until it is released or taken over.
		var held []*exactlyonce.Message
		for _, m := range todo {
			if m.Outcome == exactlyonce.InFlight {
				held = append(held, m)
			}
		}
		if len(held) == 0 {
			break
		}
		todo = held
		wait = min(max(2*wait, 50*time.Millisecond), cmp.Or(c.cfg.BackoffMax, 5*time.Second))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
	metrics.TxDuration.WithLabelValues("kafka").Observe(time.Since(start).Seconds())
	metrics.TxBatchSize.WithLabelValues("kafka").Observe(float64(len(msgs)))
	c.record(msgs)
	if c.cfg.AfterCommit != nil {
		out := make([]Message, len(batch))
		for i, r := range batch {
			out[i] = r.msg
		}
		c.cfg.AfterCommit(out)
	}
	last := batch[len(batch)-1].raw
	metrics.ConsumerLag.WithLabelValues(c.cfg.Name, last.Topic, strconv.Itoa(last.Partition)).
		Set(float64(max(last.HighWaterMark-last.Offset-1, 0)))
	return nil
}

// record counts and logs the outcomes of a committed batch.
func (c *Consumer) record(msgs []*exactlyonce.Message) {
	var applied, dups, conflicts, dead, stale int
	debug := c.log.Logger.IsLevelEnabled(logrus.DebugLevel)
	for _, m := range msgs {
		r := m.Value.(*record)
		log := c.log
		if debug || m.Outcome == exactlyonce.Conflict || m.Outcome == exactlyonce.DeadLettered {
			log = c.log.WithFields(logrus.Fields{
				"message_id": r.msg.ID, "topic": r.msg.Topic, "partition": r.msg.Partition, "offset": r.msg.Offset,
			})
		}
		switch m.Outcome {
		case exactlyonce.Applied:
			if r.stale {
				stale++
				log.Debug("stale message: effect skipped")
			} else {
				applied++
				log.Debug("message applied")
			}
		case exactlyonce.Duplicate:
			dups++
			log.Debug("duplicate message: effect not repeated")
		case exactlyonce.Conflict:
			conflicts++
			log.Warn("message id reused with a different payload: effect not run, conflict recorded")
		case exactlyonce.DeadLettered:
			dead++
			log.WithError(m.Cause).WithField("attempts", m.Attempts).Warn("message dead-lettered")
		}
	}
	name := c.cfg.Name
	metrics.Processed.WithLabelValues(name).Add(float64(applied))
	metrics.Duplicates.WithLabelValues(name).Add(float64(dups))
	metrics.Conflicts.WithLabelValues(name).Add(float64(conflicts))
	metrics.DeadLettered.WithLabelValues(name).Add(float64(dead))
	metrics.Stale.WithLabelValues(name).Add(float64(stale))
	c.log.WithFields(logrus.Fields{
		"messages": len(msgs), "applied": applied, "duplicates": dups, "conflicts": conflicts,
		"dead_lettered": dead, "stale": stale,
	}).Debug("batch committed")
}

package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/sirupsen/logrus"

	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/internal/metrics"
	"github.com/idemd/idemd/internal/retry"
)

// Defaults of RelayConfig.
const (
	RelayBatchSizeDefault     = 1000
	RelayPollIntervalDefault  = time.Second
	RelayBatchTimeoutDefault  = 2 * time.Millisecond
	RelayStandbyPollDefault   = time.Second
	RelayBackoffMinDefault    = 100 * time.Millisecond
	RelayBackoffMaxDefault    = 10 * time.Second
	RelayStatsIntervalDefault = 5 * time.Second
)

// relayRoundBytes bounds the estimated size of one round's records. Kafka refuses a record
// batch above the broker's message.max.bytes (1048588 by default) for good, so a round of
// BatchSize large rows bound for one partition would fail on every retry and stall the
// outbox; and a round the writer had to split into several batches per partition could land
// a later batch while an earlier one failed, reordering a key. One round below this bound
// makes one batch per partition that the default broker accepts.
const relayRoundBytes = 1_000_000

// recordSize over-estimates the encoded size of m in a record batch.
func recordSize(m *kafka.Message) int {
	n := 32 + len(m.Key) + len(m.Value)
	for _, h := range m.Headers {
		n += 16 + len(h.Key) + len(h.Value)
	}
	return n
}

// Writer is what the relay needs of a Kafka producer; *kafka.Writer has it.
type Writer interface {
	WriteMessages(ctx context.Context, msgs ...kafka.Message) error
	Close() error
}

// RelayConfig configures a Relay.
type RelayConfig struct {
	// Schema holds the outbox table. Defaults to "idemd".
	Schema string
	// Brokers are the Kafka bootstrap addresses. Required unless Writer is set.
	Brokers []string
	// Writer overrides the Kafka writer built from Brokers. Defaults to a kafka-go Writer
	// with RequiredAcks all, the Java-compatible murmur2 balancer and BatchTimeout.
	Writer Writer
	// BatchSize is how many rows one round publishes at most. Defaults to 1000.
	BatchSize int
	// BatchTimeout is how long the Kafka writer waits to fill a batch. Defaults to 2 ms
	// (kafka-go's own default of 1 s would add a second to every publish).
	BatchTimeout time.Duration
	// PollInterval is how often the relay looks for rows when no NOTIFY woke it; it bounds
	// the delay if a notification is lost. Defaults to 1 s.
	PollInterval time.Duration
	// StandbyPoll is how often a standby relay tries to take the leadership. Defaults to 1 s.
	StandbyPoll time.Duration
	// BackoffMin and BackoffMax bound the wait after a failed publish (broker outage).
	// Defaults to 100 ms and 10 s.
	BackoffMin, BackoffMax time.Duration
	// StatsInterval is how often the leader refreshes the backlog gauges. Defaults to 5 s.
	StatsInterval time.Duration
	// Logger receives the relay's logs. Defaults to logrus's standard logger.
	Logger *logrus.Entry
	// AfterPublish, when set, runs after a batch reached Kafka and before it is marked
	// published; an error stops the relay there, as a crash would. For tests.
	AfterPublish func(ids []int64) error
}

// Relay publishes committed outbox rows to Kafka. Exactly one relay per database is
// active: the one holding a session advisory lock on a dedicated connection. The others
// stand by and take over within StandbyPoll when the leader's connection goes away.
//
// The relay keeps no cursor: each round selects every unpublished row in id order, so a row
// whose transaction committed late is picked up by the next round, never skipped. Rows are
// marked published only after Kafka acknowledged them with acks=all; a crash in between
// publishes them again with the same operation-id header.
type Relay struct {
	pool      *pgxpool.Pool
	cfg       RelayConfig
	writer    Writer
	log       *logrus.Entry
	lockKey   int64
	channel   string
	selectSQL string
	markSQL   string
	deleteSQL string
	letters   *deadletter.Store
	statsSQL  string
	published atomic.Int64
	leader    atomic.Bool
}

// NewRelay returns a relay on pool; call Run.
func NewRelay(pool *pgxpool.Pool, cfg *RelayConfig) (*Relay, error) {
	if pool == nil {
		return nil, errors.New("outbox: NewRelay: pool is required")
	}
	c := RelayConfig{}
	if cfg != nil {
		c = *cfg
	}
	c.Schema = cmp.Or(c.Schema, SchemaDefault)
	c.BatchSize = cmp.Or(c.BatchSize, RelayBatchSizeDefault)
	c.BatchTimeout = cmp.Or(c.BatchTimeout, RelayBatchTimeoutDefault)
	c.PollInterval = cmp.Or(c.PollInterval, RelayPollIntervalDefault)
	c.StandbyPoll = cmp.Or(c.StandbyPoll, RelayStandbyPollDefault)
	c.BackoffMin = cmp.Or(c.BackoffMin, RelayBackoffMinDefault)
	c.BackoffMax = cmp.Or(c.BackoffMax, RelayBackoffMaxDefault)
	c.StatsInterval = cmp.Or(c.StatsInterval, RelayStatsIntervalDefault)
	switch {
	case c.BatchSize < 0:
		return nil, fmt.Errorf("outbox: RelayConfig.BatchSize must be positive, got %d", c.BatchSize)
	case c.BackoffMax < c.BackoffMin:
		return nil, fmt.Errorf("outbox: RelayConfig.BackoffMax (%s) is below BackoffMin (%s)", c.BackoffMax, c.BackoffMin)
	case c.Writer == nil && len(c.Brokers) == 0:
		return nil, errors.New("outbox: RelayConfig.Brokers is required")
	}
	if c.Logger == nil {
		c.Logger = logrus.NewEntry(logrus.StandardLogger())
	}
	w := c.Writer
	if w == nil {
		w = &kafka.Writer{
			Addr:         kafka.TCP(c.Brokers...),
			Balancer:     &kafka.Murmur2Balancer{},
			RequiredAcks: kafka.RequireAll,
			BatchTimeout: c.BatchTimeout,
			BatchSize:    c.BatchSize,
			BatchBytes:   64 << 20,
			// The relay retries whole batches itself, forever, with its own backoff.
			MaxAttempts:  1,
			WriteTimeout: 10 * time.Second,
			ReadTimeout:  10 * time.Second,
		}
	}
	table := pgx.Identifier{c.Schema}.Sanitize() + ".outbox"
	return &Relay{
		pool:    pool,
		cfg:     c,
		writer:  w,
		log:     c.Logger.WithField("component", "relay"),
		lockKey: relayLockKey(c.Schema),
		channel: Channel(c.Schema),
		selectSQL: `SELECT id, operation_id, pipeline, causation_id, topic, key, payload, headers
FROM ` + table + ` WHERE published_at IS NULL ORDER BY id LIMIT $1`,
		markSQL:   `UPDATE ` + table + ` SET published_at = now() WHERE id = ANY($1)`,
		deleteSQL: `DELETE FROM ` + table + ` WHERE id = $1 AND published_at IS NULL`,
		letters:   deadletter.New(c.Schema),
		statsSQL:  `SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0) FROM ` + table + ` WHERE published_at IS NULL`,
	}, nil
}

// Published returns how many records this relay has published (tests, logs).
func (r *Relay) Published() int64 { return r.published.Load() }

// IsLeader reports whether this relay currently holds the leadership.
func (r *Relay) IsLeader() bool { return r.leader.Load() }

// Run stands by, leads when it can, and publishes until ctx ends; then it closes the
// writer. It returns nil when ctx ended, or the error of an AfterPublish hook.
func (r *Relay) Run(ctx context.Context) error {
	defer r.writer.Close()
	for {
		err := r.lead(ctx)
		if r.leader.Swap(false) {
			// The backlog gauges are the leader's: a standby exports none, so that max()
			// over replicas is the new leader's value, never this process's last one.
			metrics.RelayLeader.Set(0)
			metrics.OutboxBacklog.Reset()
			metrics.OutboxOldestAge.Reset()
		}
		// The hook's error first: the test that stops the relay on it may cancel ctx at once.
		var hookErr hookError
		if errors.As(err, &hookErr) {
			return hookErr.err
		}
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			r.log.WithError(err).Warn("relay lost or could not take the leadership; standing by")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(r.cfg.StandbyPoll):
		}
	}
}

type hookError struct{ err error }

func (e hookError) Error() string { return e.err.Error() }

// lead takes the advisory lock on a dedicated connection and publishes while it holds it.
// It returns nil when the lock is held by someone else.
func (r *Relay) lead(ctx context.Context) error {
	conn, err := pgx.ConnectConfig(ctx, r.pool.Config().ConnConfig.Copy())
	if err != nil {
		return fmt.Errorf("error connecting for the relay lock: %w", err)
	}
	// Closing the connection releases the session lock, whatever else happened.
	defer conn.Close(context.WithoutCancel(ctx))

	var got bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", r.lockKey).Scan(&got); err != nil {
		return fmt.Errorf("error trying the relay lock: %w", err)
	}
	if !got {
		return nil
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{r.channel}.Sanitize()); err != nil {
		return fmt.Errorf("error listening on %s: %w", r.channel, err)
	}
	r.leader.Store(true)
	metrics.RelayLeader.Set(1)
	r.log.Info("relay is the leader: publishing the outbox")
	defer r.log.Info("relay stepped down")

	lastStats := time.Time{}
	failures := 0
	for {
		if time.Since(lastStats) >= r.cfg.StatsInterval {
			r.refreshStats(ctx)
			lastStats = time.Now()
		}
		_, more, err := r.publishBatch(ctx)
		var hookErr hookError
		switch {
		case errors.As(err, &hookErr):
			return err
		case ctx.Err() != nil:
			return nil
		case err != nil:
			failures++
			metrics.OutboxPublishErrors.WithLabelValues().Inc()
			wait := retry.Backoff(r.cfg.BackoffMin, r.cfg.BackoffMax, failures)
			r.log.WithError(err).WithField("retry_in", wait.Seconds()).Warn("error publishing outbox batch; rows are kept and retried")
			// Still the leader? A dead lock connection means someone else may lead now.
			if err := pingLock(ctx, conn); err != nil {
				return fmt.Errorf("relay lock connection lost: %w", err)
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(wait):
			}
			continue
		}
		failures = 0
		if more {
			// More may be waiting; check the lock is still ours, then go on.
			if err := pingLock(ctx, conn); err != nil {
				return fmt.Errorf("relay lock connection lost: %w", err)
			}
			continue
		}
		// Drained: sleep until a commit notifies us or the poll interval passes.
		wctx, cancel := context.WithTimeout(ctx, r.cfg.PollInterval)
		_, err = conn.WaitForNotification(wctx)
		cancel()
		if err != nil && ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("relay lock connection lost: %w", err)
		}
	}
}

// publishBatch publishes up to BatchSize unpublished rows in id order, within
// relayRoundBytes, and marks them. more reports that rows may be left.
func (r *Relay) publishBatch(ctx context.Context) (n int, more bool, err error) {
	rows, err := r.pool.Query(ctx, r.selectSQL, r.cfg.BatchSize)
	if err != nil {
		return 0, false, fmt.Errorf("error reading outbox: %w", err)
	}
	var (
		ids   []int64
		msgs  []kafka.Message
		bytes int
	)
	for rows.Next() {
		var (
			id                         int64
			op                         uuid.UUID
			pipeline, causation, topic string
			key, payload               []byte
			headers                    map[string]string
		)
		if err := rows.Scan(&id, &op, &pipeline, &causation, &topic, &key, &payload, &headers); err != nil {
			rows.Close()
			return 0, false, fmt.Errorf("error reading outbox: %w", err)
		}
		m := kafka.Message{Topic: topic, Key: key, Value: payload, Headers: recordHeaders(op, causation, pipeline, headers)}
		if bytes += recordSize(&m); bytes > relayRoundBytes && len(msgs) > 0 {
			// The rest waits for the next round, which starts at once.
			rows.Close()
			more = true
			break
		}
		ids, msgs = append(ids, id), append(msgs, m)
	}
	if err := rows.Err(); err != nil {
		return 0, false, fmt.Errorf("error reading outbox: %w", err)
	}
	if len(msgs) == 0 {
		return 0, false, nil
	}
	more = more || len(msgs) == r.cfg.BatchSize
	if err := r.writer.WriteMessages(ctx, msgs...); err != nil {
		if tooLarge(err) {
			// Kafka will never take some record of this round, and every round starts at
			// the lowest unpublished id: left there it would stop the whole outbox. Find it
			// by publishing the round one record at a time, in order.
			return r.publishOneByOne(ctx, ids, msgs)
		}
		return 0, false, fmt.Errorf("error publishing %d outbox rows to Kafka: %w", len(msgs), err)
	}
	if r.cfg.AfterPublish != nil {
		if err := r.cfg.AfterPublish(ids); err != nil {
			return 0, false, hookError{err}
		}
	}
	// Kafka has them: mark them even if ctx is ending, or they would be sent twice.
	if _, err := r.pool.Exec(context.WithoutCancel(ctx), r.markSQL, ids); err != nil {
		return 0, false, fmt.Errorf("error marking %d outbox rows published: %w", len(ids), err)
	}
	r.published.Add(int64(len(ids)))
	for _, m := range msgs {
		metrics.OutboxPublished.WithLabelValues(m.Topic).Inc()
	}
	r.log.WithField("count", len(ids)).Debug("published outbox rows")
	return len(ids), more, nil
}

func (r *Relay) refreshStats(ctx context.Context) {
	var (
		backlog int64
		age     float64
	)
	if err := r.pool.QueryRow(ctx, r.statsSQL).Scan(&backlog, &age); err != nil {
		if ctx.Err() == nil {
			r.log.WithError(err).Warn("error reading outbox backlog")
		}
		return
	}
	metrics.OutboxBacklog.WithLabelValues().Set(float64(backlog))
	metrics.OutboxOldestAge.WithLabelValues().Set(age)
}

func recordHeaders(op uuid.UUID, causation, pipeline string, extra map[string]string) []kafka.Header {
	h := make([]kafka.Header, 0, 3+len(extra))
	h = append(h,
		kafka.Header{Key: HeaderOperationID, Value: []byte(op.String())},
		kafka.Header{Key: HeaderCausationID, Value: []byte(causation)},
		kafka.Header{Key: HeaderPipeline, Value: []byte(pipeline)},
	)
	for k, v := range extra {
		switch k {
		case HeaderOperationID, HeaderCausationID, HeaderPipeline:
			continue // ours win: they are what downstream dedupes on
		}
		h = append(h, kafka.Header{Key: k, Value: []byte(v)})
	}
	return h
}

func relayLockKey(schema string) int64 {
	h := fnv.New64a()
	h.Write([]byte("idemd.relay:" + schema))
	return int64(h.Sum64())
}

// pingLock checks that the lock connection, and so the leadership, is still there. Bounded:
// a half-open connection must not keep an old leader publishing while TCP gives up.
func pingLock(ctx context.Context, conn *pgx.Conn) error {
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return conn.Ping(pctx)
}

// tooLarge reports whether the broker refused a record as larger than it accepts.
func tooLarge(err error) bool {
	var we kafka.WriteErrors
	if errors.As(err, &we) {
		for _, e := range we {
			if e != nil && !errors.Is(e, kafka.MessageSizeTooLarge) {
				return false
			}
		}
		return we.Count() > 0
	}
	return errors.Is(err, kafka.MessageSizeTooLarge)
}

// publishOneByOne publishes a round whose batch the broker refused as too large one record at
// a time, in id order, marking each as it goes and dead-lettering the ones refused alone.
// Records of the round that reached Kafka with the refused batch are published again, with
// the same operation id.
func (r *Relay) publishOneByOne(ctx context.Context, ids []int64, msgs []kafka.Message) (int, bool, error) {
	published := 0
	for i := range msgs {
		err := r.writer.WriteMessages(ctx, msgs[i])
		switch {
		case err != nil && tooLarge(err):
			if _, _, err := r.deadLetterTooLarge(ctx, ids[i], msgs[i], err); err != nil {
				return published, false, err
			}
			continue
		case err != nil:
			return published, false, fmt.Errorf("error publishing outbox row %d to Kafka: %w", ids[i], err)
		}
		if r.cfg.AfterPublish != nil {
			if err := r.cfg.AfterPublish(ids[i : i+1]); err != nil {
				return published, false, hookError{err}
			}
		}
		if _, err := r.pool.Exec(context.WithoutCancel(ctx), r.markSQL, ids[i:i+1]); err != nil {
			return published, false, fmt.Errorf("error marking outbox row %d published: %w", ids[i], err)
		}
		published++
		r.published.Add(1)
		metrics.OutboxPublished.WithLabelValues(msgs[i].Topic).Inc()
	}
	return published, true, nil
}

// deadLetterTooLarge moves an outbox row the broker refuses as too large into dead_letters,
// in one transaction, so that the rows after it are published. The letter keeps the payload
// and headers; `idemd dlq list` shows it, and the reason says what to change (the topic's
// max.message.bytes, or the producer's payload).
func (r *Relay) deadLetterTooLarge(ctx context.Context, id int64, m kafka.Message, cause error) (int, bool, error) {
	headers := make(map[string][]string, len(m.Headers))
	var causation, pipeline, op string
	for _, h := range m.Headers {
		headers[h.Key] = append(headers[h.Key], string(h.Value))
		switch h.Key {
		case HeaderCausationID:
			causation = string(h.Value)
		case HeaderPipeline:
			pipeline = string(h.Value)
		case HeaderOperationID:
			op = string(h.Value)
		}
	}
	opID, _ := uuid.Parse(op)
	letter := &deadletter.Letter{
		Pipeline: pipeline, Origin: deadletter.Origin{Door: deadletter.DoorRelay, OutboxID: id, OperationID: opID},
		Scope: "kafka:" + m.Topic, MessageID: causation, Payload: m.Value, Headers: headers,
		Metadata: map[string]any{"door": "relay", "topic": m.Topic, "key": string(m.Key), "operation_id": op, "outbox_id": id},
		Reason:   fmt.Sprintf("the broker refuses the record as too large (%d bytes of value): %v", len(m.Value), cause),
		Attempts: 1,
	}
	err := pgx.BeginFunc(context.WithoutCancel(ctx), r.pool, func(tx pgx.Tx) error {
		if _, err := r.letters.WriteTx(ctx, tx, letter); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, r.deleteSQL, id)
		return err
	})
	if err != nil {
		return 0, false, fmt.Errorf("error dead-lettering outbox row %d, too large for Kafka: %w", id, err)
	}
	metrics.DeadLettered.WithLabelValues(pipeline).Inc()
	r.log.WithField("topic", m.Topic).WithField("operation_id", op).WithField("bytes", len(m.Value)).
		Error("outbox row too large for the broker: moved to dead_letters so that the outbox goes on")
	return 0, true, nil
}

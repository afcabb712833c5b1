// Package consumer is idemd's subscriptions: its Kafka, Google Cloud Pub/Sub and Amazon SQS
// doors. A Consumer reads at-least-once messages (a Kafka topic in a consumer group, a
// Pub/Sub subscription, an SQS queue) and applies each message's effect exactly once per
// (pipeline, message id).
//
// Guarantee: messages are handled in batches, one PostgreSQL transaction per batch
// (package exactlyonce): the claims of the batch's ids, the effect of each new one (SQL, a
// Go Handler, an outbox event), and the dead letters commit together or not at all. A batch
// is acknowledged to its broker only after its transaction committed — Kafka: the offset is
// committed; Pub/Sub: Ack; SQS: DeleteMessageBatch — so a crash, a rebalance or a transient
// failure at any point leads to redelivery, never to loss, and a redelivered id is recognised
// by its processed row and its effect is not repeated. A transient failure never
// acknowledges: the messages are released (Pub/Sub Nack, SQS visibility) for redelivery.
// Nothing that a crash could lose lives only in memory.
//
// Order: a Kafka partition is applied in order. A member's partitions are dealt out to at
// most Config.BatchesInFlight workers, which run in parallel; a worker's batches may hold
// records of several of its partitions, and commit each one's offset after the batch's
// transaction. On Pub/Sub and SQS,
// the messages of one lane (a Pub/Sub ordering key, an SQS FIFO MessageGroupId) are applied
// in delivery order, and when one is released those held behind it in its lane are released
// too; other messages are applied in parallel batches (Config.BatchesInFlight). A batch that
// runs long keeps its lease: the Pub/Sub client extends ack deadlines, the SQS door extends
// visibility (Config.Lease, Config.MaxLease).
package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/sirupsen/logrus"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemd/idemd/exactlyonce"
	"github.com/idemd/idemd/internal/effectsql"
	"github.com/idemd/idemd/internal/metrics"
	"github.com/idemd/idemd/internal/pgerr"
	"github.com/idemd/idemd/internal/tracing"
	"github.com/idemd/idemd/migrations"
	"github.com/idemd/idemd/outbox"
	"github.com/idemd/idemd/pipeline"
	"github.com/idemd/idemd/processed"
)

// FetchAnswerMargin is how long after FetchMaxWait a partition reader waits for a fetch's
// answer: a broker that is busy, or far away, answers late, and an answer later than the
// reader's deadline costs a reconnection, a backoff and the fetch again. kafka-go asks the
// broker to wait its reader's MaxWait less one second when MaxWait is a second or more, and
// three quarters of it below: with MaxWait 250 ms the broker waited 187 ms and an answer
// 63 ms late failed, as answers from a loaded machine or a broker a region away do. The
// reader's MaxWait is FetchMaxWait plus this margin, so the broker waits FetchMaxWait.
const FetchAnswerMargin = time.Second

// Defaults of Config.
const (
	BatchSizeDefault         = 500
	LingerDefault            = 5 * time.Millisecond
	ShutdownTimeoutDefault   = 10 * time.Second
	FetchMaxWaitDefault      = 250 * time.Millisecond
	HeartbeatIntervalDefault = 3 * time.Second
	SessionTimeoutDefault    = 30 * time.Second
	RebalanceTimeoutDefault  = 30 * time.Second
	GroupPrefix              = "idemd-"
	BatchesInFlightDefault   = 4
	ReceiversDefault         = 4
	MaxLeaseDefault          = 10 * time.Minute
)

// Config configures a Consumer. It is plain data (plus Handler and hooks), and it is what
// a subscription of the pipelines file decodes into (the yaml names); the fields without
// one are the daemon's to fill.
type Config struct {
	// Name is the pipeline's name; message ids are unique within it. Required.
	Name string `yaml:"name"`
	// Brokers are the Kafka bootstrap addresses. Kafka only; required by Run (not by
	// replays), ignored by the other doors.
	Brokers []string `yaml:"-"`
	// Dialer opens the Kafka connections of the consumer group and its partition readers
	// (kafka-go's Dialer: TLS, SASL, a client id). Nil is kafka-go's default dialer. Kafka
	// only.
	Dialer *kafka.Dialer `yaml:"-"`
	// Topics are consumed in one consumer group. Exactly one of Topics, PubSub and SQS is
	// required: it says the door (Door).
	Topics []string `yaml:"topics"`
	// PubSub names a Google Cloud Pub/Sub subscription to consume.
	PubSub *PubSub `yaml:"pubsub"`
	// SQS names an Amazon SQS queue to consume.
	SQS *SQS `yaml:"sqs"`
	// Group is the consumer group. Kafka only. Defaults to "idemd-" + Name.
	Group string `yaml:"group"`
	// MessageID says where a message's id is: a JSON pointer, a header (Kafka) or an
	// attribute (Pub/Sub, SQS), the record key (Kafka; the ordering key or group id on
	// Pub/Sub and SQS), or a composite of several (pipeline.Field.Parts, joined
	// length-prefixed; a missing part is a missing id). Defaults, on Kafka, to the first
	// present of the headers operation-id, message-id and idempotency-key
	// (DefaultIDHeaders); on Pub/Sub and SQS, to the broker's message id (messageId,
	// MessageId), which is the same on every redelivery but new when a producer publishes
	// again: choose an attribute the producer sets once per logical message (idemd's outbox
	// sets operation-id) when producers may publish twice.
	MessageID *pipeline.Field `yaml:"message_id"`
	// Effect is the SQL run for each new message. Defaults to none.
	Effect Effect `yaml:"effect"`
	// Handler is a Go effect run for each new message, after the SQL, in the same
	// transaction. Defaults to none.
	Handler Handler `yaml:"-"`
	// Publish lists the targets of the subscription's events: each applied message writes
	// its value as one outbox event per target whose filter matches it (the event type of a
	// filter is the record's event-type header); see pipeline.Targets for their names,
	// operation ids and endpoints. Defaults to none.
	Publish pipeline.Targets `yaml:"publish"`
	// Order enables the stale-event guard. Defaults to none (every new id is applied).
	Order *pipeline.Order `yaml:"order"`
	// DeadLetter says what happens to a message that keeps failing. Defaults to 5 attempts
	// (pipeline.MaxAttemptsDefault) and a dead_letters row only.
	DeadLetter pipeline.DeadLetter `yaml:"dead_letter"`
	// Retention is how long a message id is remembered; after it the id counts as new.
	// Defaults to 7 days (pipeline.RetentionDefault).
	Retention time.Duration `yaml:"retention"`
	// Schema holds idemd's tables. Defaults to "idemd" (migrations.SchemaDefault).
	Schema string `yaml:"-"`
	// PubSubClient receives a PubSub subscription. Required by Run for one (not by
	// replays).
	PubSubClient *pubsub.Client `yaml:"-"`
	// SQSClient receives an SQS queue. Required by Run for one (not by replays);
	// *sqs.Client of aws-sdk-go-v2 satisfies it.
	SQSClient SQSClient `yaml:"-"`
	// BatchSize is the most records (Kafka) or messages (Pub/Sub, SQS) in one transaction.
	// Defaults to 500. A Kafka partition's reader also queues up to BatchSize records ahead
	// of its worker, so memory grows with it (BENCHMARKS.md, phase 43: 1,000 ran 9 % faster
	// than 500 by the median of five alternated pairs on one machine, with a third more
	// memory). The pipelines file's batch_size, at most config.BatchSizeMax.
	BatchSize int `yaml:"batch_size"`
	// BatchesInFlight bounds the batches applied at once (each holds a database
	// connection). Kafka: the partitions this member holds are dealt out to at most
	// BatchesInFlight workers, in turn; each reads its partitions and applies their records
	// in batches that may hold several of them (each partition's records in order), then
	// commits the offsets of the partitions in the batch; a batch retrying a transient
	// failure holds back its worker's partitions, not the other workers'. Pub/Sub and SQS:
	// the lanes keep their order across the batches. Defaults to 4.
	BatchesInFlight int `yaml:"batches_in_flight"`
	// Receivers is how many receives a Pub/Sub or SQS subscription keeps going at once:
	// Pub/Sub, the streaming pulls the client opens (ReceiveSettings.NumGoroutines), under
	// one flow control of MaxOutstandingMessages; SQS, the ReceiveMessage calls (10
	// messages each) in flight, each a long poll. The lanes keep their order across them
	// (docs/brokers.md). Defaults to 4.
	Receivers int `yaml:"-"`
	// Lease is how long a received Pub/Sub or SQS message stays leased before it is
	// extended: SQS, the visibility timeout asked at receipt and on each extension (a
	// message is extended once Lease/3 has passed since its receipt or last extension, by
	// a heartbeat every Lease/6; whole seconds; default 30 s); Pub/Sub, the ack deadline
	// asked at receipt and on each extension (at least 6 s; default: the client's choice,
	// 10 s to 10 minutes following the observed processing time).
	Lease time.Duration `yaml:"lease"`
	// MaxLease bounds how long a held Pub/Sub or SQS message's lease is extended; after it
	// the broker redelivers the message and its id deduplicates it. Defaults to 10 minutes.
	MaxLease time.Duration `yaml:"max_lease"`
	// BacklogInterval is how often a running SQS subscription exports its queue's backlog
	// (idemd_subscription_backlog, Backlog). Defaults to 15 s.
	BacklogInterval time.Duration `yaml:"-"`
	// Linger is how long a batch waits for more records once it has one.
	// Defaults to 5 ms.
	Linger time.Duration `yaml:"-"`
	// FetchMaxWait is how long the broker may hold a fetch that finds no new records.
	// Defaults to 250 ms. The partition reader gives the answer a further
	// FetchAnswerMargin to arrive before it calls the fetch failed (kafka-go then
	// reconnects and backs off, at least 100 ms, before fetching the same offset again).
	FetchMaxWait time.Duration `yaml:"-"`
	// ShutdownTimeout bounds the drain after Run's ctx ends: the batches in hand are
	// applied and their offsets committed within it, or rolled back and left for
	// redelivery. Defaults to 10 s.
	ShutdownTimeout time.Duration `yaml:"-"`
	// HeartbeatInterval, SessionTimeout and RebalanceTimeout tune the consumer group.
	// Default to 3 s, 30 s and 30 s.
	HeartbeatInterval time.Duration `yaml:"-"`
	SessionTimeout    time.Duration `yaml:"-"`
	RebalanceTimeout  time.Duration `yaml:"-"`
	// BackoffMin and BackoffMax bound the waits between retries of transient failures.
	// Default to 50 ms and 5 s.
	BackoffMin time.Duration `yaml:"-"`
	BackoffMax time.Duration `yaml:"-"`
	// Logger receives the consumer's logs. Defaults to logrus's standard logger; the entry
	// gets component=consumer and pipeline fields.
	Logger *logrus.Entry `yaml:"-"`
	// AfterCommit, when set, runs after a batch's transaction committed and before its
	// offset is committed or its messages acknowledged (tests crash there). Defaults to
	// nil.
	AfterCommit func(batch []Message) `yaml:"-"`
	// OnAck, when set, runs after a Pub/Sub or SQS batch was acknowledged, with the
	// messages whose acknowledgement succeeded (tests wait on it). Defaults to nil.
	OnAck func(batch []Message) `yaml:"-"`
	// OnAssign, when set, runs when the group hands this consumer its partitions for a new
	// generation (after every rebalance), with the partitions of each topic it now holds.
	// Defaults to nil.
	OnAssign func(generation int32, partitions map[string][]int) `yaml:"-"`
	// OnOffsetCommit, when set, runs after the offset of a batch was committed: next is the
	// partition's new committed offset (tests wait on it). Defaults to nil.
	OnOffsetCommit func(topic string, partition int, next int64) `yaml:"-"`
	// TracerProvider records a span per record (continuing its traceparent) and the unit
	// of work's spans. Defaults to OpenTelemetry's global provider; while that is a no-op
	// one (tracing off), no span is made, and a record's traceparent is passed on to the
	// events as it came.
	TracerProvider trace.TracerProvider `yaml:"-"`
	// Handoff passes the outbox rows of each committed batch to the relay of this process
	// (outbox.Handoff), which then need not read them back. Optional; the daemon sets it.
	Handoff *outbox.Handoff `yaml:"-"`
	// Filter spares the claims the lookup of their new ids in processed_messages' older
	// epochs (processed.EpochFilter, of Schema; keep it current with its Run). Optional; the
	// daemon sets it.
	Filter *processed.EpochFilter `yaml:"-"`
}

// PubSub names a Google Cloud Pub/Sub subscription. idemd creates none (outside idemd dev).
type PubSub struct {
	// Subscription is a subscription id of Project, or a full name
	// projects/PROJECT/subscriptions/ID. Required.
	Subscription string `yaml:"subscription"`
	// Project is the subscription's project, for a subscription id. Defaults to the
	// client's project (the daemon's PUBSUB_PROJECT_ID or GOOGLE_CLOUD_PROJECT).
	Project string `yaml:"project"`
}

// name is the subscription's name for the client: a full name when Project is set, else as
// given.
func (p *PubSub) name() string {
	if p.Project != "" && !strings.HasPrefix(p.Subscription, "projects/") {
		return "projects/" + p.Project + "/subscriptions/" + p.Subscription
	}
	return p.Subscription
}

// SQS names an Amazon SQS queue, standard or FIFO. idemd creates none (outside idemd dev).
type SQS struct {
	// Queue is a queue name, resolved with GetQueueUrl, or a queue URL. Required.
	Queue string `yaml:"queue"`
}

// SQSClient is what an SQS subscription needs of its client; *sqs.Client of aws-sdk-go-v2
// has it.
type SQSClient interface {
	GetQueueUrl(ctx context.Context, in *sqs.GetQueueUrlInput, opts ...func(*sqs.Options)) (*sqs.GetQueueUrlOutput, error)
	GetQueueAttributes(ctx context.Context, in *sqs.GetQueueAttributesInput, opts ...func(*sqs.Options)) (*sqs.GetQueueAttributesOutput, error)
	ReceiveMessage(ctx context.Context, in *sqs.ReceiveMessageInput, opts ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error)
	DeleteMessageBatch(ctx context.Context, in *sqs.DeleteMessageBatchInput, opts ...func(*sqs.Options)) (*sqs.DeleteMessageBatchOutput, error)
	ChangeMessageVisibility(ctx context.Context, in *sqs.ChangeMessageVisibilityInput, opts ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityOutput, error)
}

// Door says which broker the subscription reads: "kafka" (Topics), "pubsub" (PubSub) or
// "sqs" (SQS). A config naming several is refused by New.
func (c *Config) Door() string {
	switch {
	case c.PubSub != nil:
		return DoorPubSub
	case c.SQS != nil:
		return DoorSQS
	}
	return DoorKafka
}

// source names what the subscription reads, for logs: its topics, its Pub/Sub subscription
// or its SQS queue.
func (c *Config) source() string {
	switch c.Door() {
	case DoorPubSub:
		return c.PubSub.Subscription
	case DoorSQS:
		return c.SQS.Queue
	}
	return strings.Join(c.Topics, ",")
}

// Effect is a subscription's SQL effect.
type Effect struct {
	// SQL runs for each new message, with pgx named arguments (Params). It is checked at
	// New: it must prepare. Defaults to none.
	SQL string `yaml:"sql"`
}

// Consumer consumes one subscription. Create it with New, run it with Run.
type Consumer struct {
	mu    sync.Mutex
	owned map[partitionKey]bool // the current generation's partitions
	cfg   Config
	pool  *pgxpool.Pool
	unit  *exactlyonce.Unit
	log   *logrus.Entry
	// stmt is the SQL effect, compiled once at New; stmtHeaders, whether it reads @headers.
	stmt        *effectsql.Statement
	stmtHeaders bool
	tracer      *tracing.Tracer
	sqsURL      string // the SQS queue's URL, once resolved (guarded by mu)
	// fetchDialer opens the partition readers' connections: cfg.Dialer with a read buffer
	// under each (readbuffer.go).
	fetchDialer *kafka.Dialer
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
	if err := c.checkDoor(); err != nil {
		return nil, err
	}
	door := c.Door()
	if door == DoorKafka {
		c.Group = cmp.Or(c.Group, GroupPrefix+c.Name)
	}
	c.BatchesInFlight = cmp.Or(c.BatchesInFlight, BatchesInFlightDefault)
	c.Receivers = cmp.Or(c.Receivers, ReceiversDefault)
	c.MaxLease = cmp.Or(c.MaxLease, MaxLeaseDefault)
	c.BacklogInterval = cmp.Or(c.BacklogInterval, LagIntervalDefault)
	c.Schema = cmp.Or(c.Schema, migrations.SchemaDefault)
	c.BatchSize = cmp.Or(c.BatchSize, BatchSizeDefault)
	c.Linger = cmp.Or(c.Linger, LingerDefault)
	c.FetchMaxWait = cmp.Or(c.FetchMaxWait, FetchMaxWaitDefault)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, ShutdownTimeoutDefault)
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, HeartbeatIntervalDefault)
	c.SessionTimeout = cmp.Or(c.SessionTimeout, SessionTimeoutDefault)
	c.RebalanceTimeout = cmp.Or(c.RebalanceTimeout, RebalanceTimeoutDefault)
	c.DeadLetter.MaxAttempts = cmp.Or(c.DeadLetter.MaxAttempts, pipeline.MaxAttemptsDefault)
	if c.Logger == nil {
		c.Logger = logrus.NewEntry(logrus.StandardLogger())
	}
	switch {
	case c.BatchSize < 1:
		return nil, fmt.Errorf("consumer %s: BatchSize must be positive, got %d", c.Name, c.BatchSize)
	case c.Linger < 0:
		return nil, fmt.Errorf("consumer %s: Linger must not be negative, got %s", c.Name, c.Linger)
	case c.DeadLetter.MaxAttempts < 1:
		return nil, fmt.Errorf("consumer %s: DeadLetter.MaxAttempts must be positive, got %d", c.Name, c.DeadLetter.MaxAttempts)
	case c.Retention < 0:
		return nil, fmt.Errorf("consumer %s: Retention must not be negative, got %s", c.Name, c.Retention)
	case c.BatchesInFlight < 1:
		return nil, fmt.Errorf("consumer %s: BatchesInFlight must be positive, got %d", c.Name, c.BatchesInFlight)
	case c.Receivers < 1:
		return nil, fmt.Errorf("consumer %s: Receivers must be positive, got %d", c.Name, c.Receivers)
	case c.Lease < 0 || c.MaxLease < 0:
		return nil, fmt.Errorf("consumer %s: Lease and MaxLease must not be negative, got %s and %s", c.Name, c.Lease, c.MaxLease)
	}
	broker := door != DoorKafka
	if c.MessageID != nil {
		if err := validateField(c.MessageID, broker); err != nil {
			return nil, fmt.Errorf("consumer %s: MessageID: %w", c.Name, err)
		}
	}
	var perr error
	if broker {
		perr = c.Publish.ValidateBroker()
	} else {
		perr = c.Publish.Validate(true)
	}
	if perr != nil {
		return nil, fmt.Errorf("consumer %s: Publish%w", c.Name, perr)
	}
	for i, t := range c.Publish {
		if t.Body == pipeline.BodyEffect {
			return nil, fmt.Errorf("consumer %s: Publish[%d].Body: subscriptions publish the consumed payload; body effect is for sources", c.Name, i)
		}
	}
	if c.Order != nil {
		err := c.Order.Validate(true)
		if broker {
			err = c.Order.ValidateBroker()
		}
		if err != nil {
			return nil, fmt.Errorf("consumer %s: Order: %w", c.Name, err)
		}
	}
	log := c.Logger.WithField("component", "consumer").WithField("pipeline", c.Name)
	var stmt *effectsql.Statement
	if c.Effect.SQL != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var err error
		if stmt, err = checkSQL(ctx, pool, c.Effect.SQL); err != nil {
			return nil, fmt.Errorf("consumer %s: SQL: %w", c.Name, err)
		}
	}
	store, err := processed.New(&processed.Config{Schema: c.Schema, Retention: c.Retention, Filter: c.Filter})
	if err != nil {
		return nil, fmt.Errorf("consumer %s: %w", c.Name, err)
	}
	con := &Consumer{cfg: c, pool: pool, log: log, stmt: stmt, tracer: tracing.NewTracer(c.TracerProvider, tracerScope)}
	con.stmtHeaders = stmt != nil && slices.Contains(stmt.Params, "headers")
	if door == DoorKafka {
		con.fetchDialer = FetchDialer(c.Dialer)
	}
	con.unit, err = exactlyonce.New(pool, &exactlyonce.Config{
		Schema:     c.Schema,
		Processed:  store,
		BackoffMin: c.BackoffMin,
		BackoffMax: c.BackoffMax,
		Logger:     log,
		OnRetry:    func(error) { metrics.Retries.WithLabelValues(door).Inc() },
		// The unit's spans continue each record's (its message's Trace).
		TracerProvider: c.TracerProvider,
		Handoff:        c.Handoff,
	})
	if err != nil {
		return nil, fmt.Errorf("consumer %s: %w", c.Name, err)
	}
	metrics.Pipeline(c.Name, door)
	return con, nil
}

// checkDoor checks the subscription's name and source: exactly one of Topics, PubSub and
// SQS, and the fields of its door.
func (c *Config) checkDoor() error {
	if c.Name == "" {
		return errors.New("consumer: Name is required")
	}
	n := 0
	for _, set := range []bool{len(c.Topics) > 0, c.PubSub != nil, c.SQS != nil} {
		if set {
			n++
		}
	}
	switch {
	case n == 0:
		return fmt.Errorf("consumer %s: one of Topics, PubSub and SQS is required", c.Name)
	case n > 1:
		return fmt.Errorf("consumer %s: Topics, PubSub and SQS are exclusive: name one source", c.Name)
	case c.Door() != DoorKafka && c.Group != "":
		return fmt.Errorf("consumer %s: Group is for Kafka subscriptions", c.Name)
	}
	switch c.Door() {
	case DoorKafka:
		for i, t := range c.Topics {
			if t == "" {
				return fmt.Errorf("consumer %s: Topics[%d] is empty", c.Name, i)
			}
		}
	case DoorPubSub:
		if err := c.PubSub.Validate(); err != nil {
			return fmt.Errorf("consumer %s: PubSub: %w", c.Name, err)
		}
	case DoorSQS:
		if c.SQS.Queue == "" {
			return fmt.Errorf("consumer %s: SQS.Queue is required", c.Name)
		}
	}
	return nil
}

// Validate checks the subscription's name; an error starts with the field at fault
// ("subscription: …", "project: …").
func (p *PubSub) Validate() error {
	switch full := strings.HasPrefix(p.Subscription, "projects/"); {
	case p.Subscription == "":
		return errors.New("subscription: required")
	case full && !pubsubName.MatchString(p.Subscription):
		return fmt.Errorf("subscription: %q is not projects/PROJECT/subscriptions/ID", p.Subscription)
	case full && p.Project != "":
		return errors.New("project: the subscription is a full name, which names its project")
	case !full && strings.Contains(p.Subscription, "/"):
		return fmt.Errorf("subscription: %q is neither an id nor projects/PROJECT/subscriptions/ID", p.Subscription)
	case strings.Contains(p.Project, "/"):
		return fmt.Errorf("project: %q is not a project id", p.Project)
	}
	return nil
}

var pubsubName = regexp.MustCompile(`^projects/[^/]+/subscriptions/[^/]+$`)

// validateField checks a field of a Kafka subscription (header, no attribute) or of a
// Pub/Sub or SQS one (attribute, no header).
func validateField(f *pipeline.Field, broker bool) error {
	if broker {
		return f.ValidateBroker()
	}
	return f.Validate(true)
}

// Name returns the pipeline's name.
func (c *Consumer) Name() string { return c.cfg.Name }

// Config returns the consumer's config, defaults filled in.
func (c *Consumer) Config() Config { return c.cfg }

// Owns reports whether this consumer holds the partition in the group's current
// generation (false when it is not running).
func (c *Consumer) Owns(topic string, partition int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.owned[partitionKey{topic, partition}]
}

type partitionKey struct {
	topic     string
	partition int
}

// process applies one batch in one transaction and records the outcomes.
func (c *Consumer) process(ctx context.Context, batch []*record) (err error) {
	units, done := unitSlab(len(batch))
	defer done()
	msgs := make([]*exactlyonce.Message, len(batch))
	for i, r := range batch {
		msgs[i] = c.message(&units[i], r)
	}
	if spans := c.startRecords(batch, msgs); spans != nil {
		defer func() { endRecords(spans, msgs, err) }()
	}
	start := time.Now()
	if err := c.unit.Apply(ctx, msgs); err != nil {
		return err
	}
	door := c.cfg.Door()
	metrics.TxDuration.WithLabelValues(door).Observe(time.Since(start).Seconds())
	metrics.TxBatchSize.WithLabelValues(door).Observe(float64(len(msgs)))
	c.record(batch, msgs)
	if c.cfg.AfterCommit != nil {
		out := make([]Message, len(batch))
		for i, r := range batch {
			r.headers()
			out[i] = r.msg
		}
		c.cfg.AfterCommit(out)
	}
	return nil
}

// messageLog is the entry of r's log lines: its id and topic, and its partition and offset
// on Kafka, or its door (pubsub, sqs) on a broker whose messages have neither (the topic
// is then the subscription or queue).
func (c *Consumer) messageLog(r *record) *logrus.Entry {
	if door := r.msg.Door; door == DoorPubSub || door == DoorSQS {
		return c.log.WithFields(logrus.Fields{"message_id": r.msg.ID, "topic": r.msg.Topic, "door": door})
	}
	return c.log.WithFields(logrus.Fields{
		"message_id": r.msg.ID, "topic": r.msg.Topic, "partition": r.msg.Partition, "offset": r.msg.Offset,
	})
}

// record counts and logs the outcomes of a committed batch.
func (c *Consumer) record(batch []*record, msgs []*exactlyonce.Message) {
	var applied, dups, conflicts, dead, stale int
	debug := c.log.Logger.IsLevelEnabled(logrus.DebugLevel)
	for i, m := range msgs {
		r := batch[i]
		log := c.log
		if debug || m.Outcome == exactlyonce.Conflict || m.Outcome == exactlyonce.DeadLettered {
			log = c.messageLog(r)
		}
		switch m.Outcome {
		case exactlyonce.Applied:
			applied++
			log.Debug("message applied")
		case exactlyonce.Stale:
			stale++
			log.Debug("stale message: effect skipped")
		case exactlyonce.Duplicate:
			dups++
			log.Debug("duplicate message: effect not repeated")
		case exactlyonce.Conflict:
			conflicts++
			log.Warn("message id reused with a different payload: effect not run, conflict recorded")
		case exactlyonce.DeadLettered:
			dead++
			log.WithField("error", pgerr.ForLog(m.Cause, log.Logger.IsLevelEnabled(logrus.DebugLevel))).WithField("attempts", m.Attempts).
				Warn("message dead-lettered (the error is whole in the dead letter)")
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

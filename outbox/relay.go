package outbox

import (
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/sirupsen/logrus"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/internal/metrics"
	"github.com/idemd/idemd/internal/pgerr"
	"github.com/idemd/idemd/internal/retry"
	"github.com/idemd/idemd/internal/testsignal"
	"github.com/idemd/idemd/internal/tracing"
	"github.com/idemd/idemd/migrations"
)

// Defaults of RelayConfig.
const (
	// RelayBatchSizeDefault: a round is bounded by relayRoundBytes (1 MB) as well, about
	// 3,000 events of 300 bytes. At 1000 a relay under full load that once fell behind its
	// consumer read every row back from the table, a round per 1,000, and stayed behind
	// (BENCHMARKS.md, phase 22).
	RelayBatchSizeDefault    = 4000
	RelayPollIntervalDefault = time.Second
	// RelayBatchTimeoutDefault: a round's write holds every record it has for each
	// partition (tieredWriter), so the writer has nothing to wait for; kafka-go takes 0 as
	// its own 1 s. At 2 ms a round whose batches were not full waited 2 ms: 0.8 against 6 ms
	// of median 2xx-to-record latency at 1,000 webhooks/s (BENCHMARKS.md, phase 23).
	RelayBatchTimeoutDefault  = time.Microsecond
	RelayStandbyPollDefault   = time.Second
	RelayBackoffMinDefault    = 100 * time.Millisecond
	RelayBackoffMaxDefault    = 10 * time.Second
	RelayStatsIntervalDefault = 5 * time.Second
	RelayFloorIntervalDefault = 200 * time.Millisecond
	RelayMaxFailingForDefault = 10 * time.Minute
	RelayLockCheckDefault     = 10 * time.Second
	RelayLockTimeoutDefault   = time.Minute
)

// Writer is what the relay needs of a Kafka producer; *kafka.Writer has it. The relay calls
// WriteMessages from several goroutines at once (one per topic of a round).
type Writer interface {
	WriteMessages(ctx context.Context, msgs ...kafka.Message) error
	Close() error
}

// RelayConfig configures a Relay.
type RelayConfig struct {
	// Schema holds the outbox table. Defaults to "idemd".
	Schema string
	// Brokers are the Kafka bootstrap addresses. Required unless Writer, PubSub or SQS is
	// set: a relay without Kafka holds the rows bound for Kafka topics as failing (with an
	// error that says so), as it holds the rows of a broker it has no Publisher for.
	Brokers []string
	// Writer overrides the Kafka writer built from Brokers. Defaults to kafka-go Writers
	// with RequiredAcks all, the Java-compatible murmur2 balancer and BatchTimeout, of
	// several BatchSizes, each round written by the smallest that holds the records it
	// sends to any one partition (tieredWriter). A
	// Writer of the caller's own should hold a round whole too (a BatchSize of BatchSize),
	// so that a partition's records of a round go in one produce request.
	Writer Writer
	// PubSub publishes the events bound for Pub/Sub topics (PubSubDestination): a
	// PubSubPublisher. Defaults to none: those events wait, their destination held as
	// failing with an error naming the missing client, until a relay that has one leads.
	// Run closes it when it returns.
	PubSub Publisher
	// SQS publishes the events bound for SQS queues (SQSDestination): an SQSPublisher.
	// Defaults to none, with the same consequence as PubSub's. Run closes it when it
	// returns.
	SQS Publisher
	// BatchSize is how many rows one round publishes at most (and 1 MB of events at most,
	// whatever BatchSize says). Defaults to 4000.
	BatchSize int
	// BatchTimeout is how long the Kafka writer waits to fill a batch. Defaults to 1 µs:
	// a round's write already holds all of the round's records (kafka-go's own default of
	// 1 s would add a second to every publish).
	BatchTimeout time.Duration
	// PollInterval is how often the relay looks for rows when no NOTIFY woke it; it bounds
	// the delay if a notification is lost. Defaults to 1 s.
	PollInterval time.Duration
	// StandbyPoll is how often a standby relay tries to take the leadership, on the session
	// it keeps for that (a new one only when the server ended it). Defaults to 1 s.
	StandbyPoll time.Duration
	// LockCheck is how often the leader checks that the PostgreSQL session holding its lock
	// still answers (a ping of at most 5 s): a leader whose session ended or stopped
	// answering steps down. Defaults to 10 s.
	//
	// LockTimeout is how long that session may go without a query before PostgreSQL ends it
	// (idle_session_timeout, PostgreSQL 14 and later), which releases the lock for a
	// standby: a leader that hangs, or whose connection is frozen, hands over within
	// LockTimeout. Keep it above LockCheck plus a round's longest time. The session also
	// asks the server for TCP keepalives (10 s idle, then every 5 s, 3 missed), so that the
	// lock of a leader whose host or network died is released within about 25 s. Defaults
	// to 1 minute.
	LockCheck, LockTimeout time.Duration
	// BackoffMin and BackoffMax bound the wait before a destination (a Kafka or Pub/Sub
	// topic, an SQS queue) whose publish failed (broker outage, missing topic or queue,
	// refused authorization) is tried again; other destinations go on meanwhile. Defaults
	// to 100 ms and 10 s.
	BackoffMin, BackoffMax time.Duration
	// MaxFailingFor is how long a destination may keep failing with an error that retrying
	// does not fix — the topic or queue does not exist (deleted, or never created while the
	// brokers do not create topics on demand) or the relay may not write to it — before its
	// rows are moved to dead_letters, from where `idemd dlq replay` puts each back with its
	// operation id once the destination is fixed. Rows of other destinations never wait for
	// it, and a broker outage never counts (nor does a missing client: see PubSub). A
	// negative value keeps the rows until the destination works. Defaults to 10 minutes.
	MaxFailingFor time.Duration
	// StatsInterval is how often the leader refreshes the backlog gauges. Defaults to 5 s.
	StatsInterval time.Duration
	// FloorInterval is how often the leader tries to raise its floor, the id below which
	// no row is unpublished, now or ever, from which its reads of the table start (see
	// floorFence in relay_floor.go). Defaults to 200 ms.
	FloorInterval time.Duration
	// KeepPublished keeps a published row, with its published_at, until the pruner deletes
	// it after the outbox retention, so that the console and `idemd inspect` show what was
	// published: the relay moves it from the outbox to outbox_published. It costs a second
	// write of every row (and its three indexes there) and the vacuuming of it. Defaults
	// to false: a row is deleted once the broker has acknowledged it. Either way the outbox
	// holds only what waits.
	KeepPublished bool
	// Handoff, when set, receives the rows that this process's writers committed (the Store
	// of the unit of work, given the same Handoff): while this relay leads and is caught up,
	// it publishes them without reading them back from the table. See Handoff. Optional.
	Handoff *Handoff
	// Logger receives the relay's logs. Defaults to logrus's standard logger.
	Logger *logrus.Entry
	// AfterPublish, when set, runs after a round's events reached their brokers and before
	// they are marked published; an error stops the relay there, as a crash would. For tests.
	AfterPublish func(ids []int64) error
	// TracerProvider records a span per publish of a destination's rows (a write to Kafka,
	// a Publish to Pub/Sub or SQS), linked to the trace context stored with each row
	// (trace.go). Defaults to OpenTelemetry's global provider; while
	// that is a no-op one (tracing off), no span is made. Records carry their row's
	// traceparent either way.
	TracerProvider trace.TracerProvider
}

// Relay publishes committed outbox rows to Kafka, Pub/Sub and SQS, each row to the
// destination its topic column encodes (ParseDestination). Exactly one relay per database is
// active: the one holding a session advisory lock on a dedicated connection. The others
// stand by, each trying the lock every StandbyPoll on a session it keeps for that, and take
// over within StandbyPoll when the leader's connection goes away.
//
// The relay keeps no cursor: each round selects every unpublished row in id order, so a row
// whose transaction committed late is picked up by the next round, never skipped. When it is
// behind, it reads the next round ahead while publishing the current one (see ahead); a
// late row then waits for the next full read, at most a few rounds. Rows are
// deleted (or, with KeepPublished, marked published) only after their broker acknowledged
// them (Kafka with acks=all); a crash in between publishes them again with the same
// operation-id header or attribute (and, on an SQS FIFO queue, the same deduplication id).
// With a Handoff (RelayConfig.Handoff), the rows its own process committed are handed to it
// and, while it is caught up, published without being read back; see Handoff for how the
// same guarantees hold.
//
// A round publishes each destination's rows separately: a destination that fails (a broker
// refusing it, a topic or queue that does not exist, a missing authorization) is left out
// of the following rounds until its retry, so that the other destinations keep flowing,
// and its rows keep their order because none of them is published while an earlier one of
// its key waits. A row its broker refuses for good (too large, invalid) is dead-lettered
// alone, and the rest goes on.
type Relay struct {
	// decided is closed once Run first learned whether it leads: Drain waits for it, so
	// that a relay asked to drain just after it started does not answer ErrNotLeader
	// before it even tried.
	decided     chan struct{}
	decidedOnce sync.Once
	pool        *pgxpool.Pool
	cfg         RelayConfig
	writer      Writer // nil: no Kafka
	// transport is the Kafka writer's when the relay built it (from Brokers): closed with
	// it, so that a relay that stops leaves no connection nor goroutine behind (kafka-go's
	// DefaultTransport keeps a pool per address until the process exits).
	transport *kafka.Transport
	outlets   map[string]outlet
	log       *logrus.Entry
	lockKey   int64
	channel   string
	selectSQL string
	// selectAfterSQL reads ahead (ahead), after an id, while no destination is held.
	selectAfterSQL string
	// markIDs deletes (or marks) the rows a round published.
	markIDs   byIDs
	deleteSQL string
	// take deletes (or marks) handed rows in the transaction that publishes them, returning
	// those still unpublished; olderSQL then asks whether an unpublished row is left below
	// them, and olderGapsSQL the same below the first and between them. takeOlderSQL
	// deletes (or marks) the unpublished rows of the ids given (the holes below the first
	// and between them), returning them to be published in the same round.
	take         byIDs
	olderSQL     string
	olderGapsSQL string
	takeOlderSQL string
	// passedOverSQL asks whether a row a read ahead passed over has one of its keys.
	passedOverSQL string
	letters       *deadletter.Store
	statsSQL      string
	published     atomic.Int64
	pubRounds     atomic.Int64 // rounds that published (marked or deleted rows)
	leader        atomic.Bool
	tracer        *tracing.Tracer

	// failing are the topics whose last publish failed. Only the leading goroutine uses it.
	failing map[string]*topicFailure
	// next is the next round's rows being read ahead, and sinceFull the rounds read ahead
	// since the last full read. Only the leading goroutine uses them.
	next       *ahead
	sinceFull  int
	readAheads atomic.Int64 // rounds whose rows were read ahead
	// aheadsDropped counts the rows read ahead and dropped for a key's order (passedOver).
	aheadsDropped atomic.Int64
	// warnedNoIdleTimeout: the warning that the server has no idle_session_timeout was
	// logged (once a relay, not once a session). Run's goroutine only.
	warnedNoIdleTimeout bool
	// lastRows is how many rows the last round read: the room the next one's first
	// destination starts with.
	lastRows atomic.Int64
	// selectDue: the next round reads the table (the Handoff's rows wait): the last read
	// left rows behind, a NOTIFY came, the poll interval passed, or handed rows were turned
	// away. lastSelect is when the table was last read. Only the leading goroutine uses them.
	selectDue  bool
	lastSelect time.Time
	handedRuns atomic.Int64 // rounds that published handed rows (tests, the bench)
	handedRows atomic.Int64 // rows those rounds published
	fallbacks  atomic.Int64 // handed rounds that found an older row and read the table instead
	olderTaken atomic.Int64 // older rows the check for them found by id and published with handed rows
	gapProbes  atomic.Int64 // ids between handed rows looked for by the check for older rows
	// belowProbes are ids below handed rows looked for one by one by the check (holesBelow),
	// belowWalks the checks that walked the primary key from the floor instead.
	belowProbes atomic.Int64
	belowWalks  atomic.Int64
	// recent are ids of rows this relay deleted (or moved) lately, sorted (remember). Only
	// the leading goroutine uses them.
	recent []int64
	// floor: no row below it is unpublished, now or ever; fence is the open one, fences how
	// many closed, lastFence when the last step was (relay_floor.go). Only the
	// leading goroutine uses them; floorValue is floor for Floor.
	floor     int64
	fence     *floorFence
	fences    int
	lastFence time.Time
	// floorFailing: the last step failed (its error was logged); floorOff: the role may
	// not read the identity, the floor stays at the bottom.
	floorFailing, floorOff bool

	floorValue atomic.Int64
	table      string // the outbox, quoted
	lastIDSQL  string
	lowestSQL  string

	mu         sync.Mutex
	rounds     uint64             // rounds started since the relay was created
	waiters    []*drainWaiter     // Drain calls waiting for a clean round
	cancelWait context.CancelFunc // ends the leader's idle wait (Drain wakes it)
	woken      bool               // Drain asked for a round while one ran

	signals relaySignals
}

// relaySignals are the relay's test signals (internal/testsignal): inert unless a test
// initialised them before Run.
type relaySignals struct {
	// Leading is signalled each time the relay takes the leadership.
	Leading testsignal.Signal[struct{}]
	// Warmed is signalled when the warm-up of the Kafka writer's connections that follows
	// Leading ended (warmWriter), with its error; not when the writer is not a
	// *kafka.Writer.
	Warmed testsignal.Signal[error]
	// Round is signalled after each round that published, dead-lettered or failed
	// something.
	Round testsignal.Signal[round]
	// ReadingAhead, when set, runs in a read ahead's goroutine before its read: a test
	// commits rows at that moment.
	ReadingAhead func()
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
	c.Schema = cmp.Or(c.Schema, migrations.SchemaDefault)
	c.BatchSize = cmp.Or(c.BatchSize, RelayBatchSizeDefault)
	c.BatchTimeout = cmp.Or(c.BatchTimeout, RelayBatchTimeoutDefault)
	c.PollInterval = cmp.Or(c.PollInterval, RelayPollIntervalDefault)
	c.StandbyPoll = cmp.Or(c.StandbyPoll, RelayStandbyPollDefault)
	c.BackoffMin = cmp.Or(c.BackoffMin, RelayBackoffMinDefault)
	c.BackoffMax = cmp.Or(c.BackoffMax, RelayBackoffMaxDefault)
	c.MaxFailingFor = cmp.Or(c.MaxFailingFor, RelayMaxFailingForDefault)
	c.StatsInterval = cmp.Or(c.StatsInterval, RelayStatsIntervalDefault)
	c.FloorInterval = cmp.Or(c.FloorInterval, RelayFloorIntervalDefault)
	c.LockCheck = cmp.Or(c.LockCheck, RelayLockCheckDefault)
	c.LockTimeout = cmp.Or(c.LockTimeout, RelayLockTimeoutDefault)
	switch {
	case c.BatchSize < 0:
		return nil, fmt.Errorf("outbox: RelayConfig.BatchSize must be positive, got %d", c.BatchSize)
	case c.BackoffMax < c.BackoffMin:
		return nil, fmt.Errorf("outbox: RelayConfig.BackoffMax (%s) is below BackoffMin (%s)", c.BackoffMax, c.BackoffMin)
	case c.Writer == nil && len(c.Brokers) == 0 && c.PubSub == nil && c.SQS == nil:
		return nil, errors.New("outbox: RelayConfig.Brokers is required (or PubSub, SQS)")
	}
	if c.Logger == nil {
		c.Logger = logrus.NewEntry(logrus.StandardLogger())
	}
	w := c.Writer
	var transport *kafka.Transport
	if w == nil && len(c.Brokers) > 0 {
		// DefaultTransport's settings, in a transport of the relay's own.
		transport = &kafka.Transport{Dial: (&net.Dialer{Timeout: 3 * time.Second}).DialContext}
		addr := kafka.TCP(c.Brokers...)
		w = newTieredWriter(c.BatchSize, cachedPartitions(transport, addr), func(batchSize int) *kafka.Writer {
			return &kafka.Writer{
				Addr: addr,
				// The transport, and the partition counts the tieredWriter read.
				Transport: countedTransport{transport},
				// Balancer: Java's murmur2 partitioner, as the tieredWriter's assign
				// applies it (newTieredWriter sets it).
				RequiredAcks: kafka.RequireAll,
				BatchTimeout: c.BatchTimeout,
				BatchSize:    batchSize,
				BatchBytes:   64 << 20,
				// The relay retries failed topics itself, forever, with its own backoff.
				MaxAttempts:  1,
				WriteTimeout: 10 * time.Second,
				ReadTimeout:  10 * time.Second,
			}
		})
	}
	table := pgx.Identifier{c.Schema}.Sanitize() + ".outbox"
	lastIDSQL, lowestSQL := floorSQL(table)
	return &Relay{
		table:     table,
		lastIDSQL: lastIDSQL,
		lowestSQL: lowestSQL,
		decided:   make(chan struct{}),
		pool:      pool,
		cfg:       c,
		writer:    w,
		transport: transport,
		outlets: map[string]outlet{
			DestinationKafka:  kafkaOutlet{w},
			DestinationPubSub: brokerOutlet{DestinationPubSub, c.PubSub},
			DestinationSQS:    brokerOutlet{DestinationSQS, c.SQS},
		},
		log:     c.Logger.WithField("component", "relay"),
		lockKey: relayLockKey(c.Schema),
		channel: Channel(c.Schema),
		// $2 are the topics waiting for a retry: their rows stay where they are; $3 is the
		// floor.
		selectSQL: `SELECT ` + rowColumns + `
FROM ` + table + ` WHERE published_at IS NULL AND topic <> ALL($2::text[]) AND id >= $3 ORDER BY id LIMIT $1`,
		selectAfterSQL: `SELECT ` + rowColumns + `
FROM ` + table + ` WHERE published_at IS NULL AND id > $2 ORDER BY id LIMIT $1`,
		markIDs:      markByIDs(c.Schema, c.KeepPublished, ``, ``),
		deleteSQL:    `DELETE FROM ` + table + ` WHERE id = ANY($1) AND published_at IS NULL`,
		take:         markByIDs(c.Schema, c.KeepPublished, ` AND published_at IS NULL`, `id`),
		takeOlderSQL: markByIDs(c.Schema, c.KeepPublished, ` AND published_at IS NULL`, rowColumns).anyOf,
		olderSQL:     `SELECT EXISTS (SELECT FROM ` + table + ` WHERE published_at IS NULL AND id >= $3 AND id < $1 AND id <> ALL($2))`,
		passedOverSQL: `SELECT EXISTS (SELECT FROM ` + table + ` o WHERE published_at IS NULL AND id >= $3 AND id <= $1
    AND (o.topic, o.key) IN (SELECT * FROM unnest($2::text[], $4::bytea[])))`,
		olderGapsSQL: `SELECT EXISTS (SELECT FROM ` + table + ` WHERE published_at IS NULL AND id >= $3 AND id < $1)
    OR EXISTS (SELECT FROM ` + table + ` WHERE id = ANY($2) AND published_at IS NULL)`,
		letters: deadletter.New(c.Schema),
		tracer:  tracing.NewTracer(c.TracerProvider, relayTracerScope),
		// From the floor, by the primary key: a sequential scan reads every dead row.
		statsSQL: `SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0) FROM ` + table + ` WHERE published_at IS NULL AND id >= $1`,
	}, nil
}

// markByIDs is the statement that records the rows of some ids as published, with extra
// after the condition on their ids, returning the columns returning names (none when it is
// empty): they are deleted from the outbox, or with keep moved to outbox_published
// (MovePublishedSQL).
func markByIDs(schema string, keep bool, extra, returning string) byIDs {
	q := pgx.Identifier{schema}.Sanitize()
	ret := ""
	if returning != "" {
		ret = ` RETURNING ` + returning
	}
	if !keep {
		return newByIDs(`DELETE FROM `+q+`.outbox WHERE `, extra+ret)
	}
	head, tail := moveParts(q, ret)
	return newByIDs(head, extra+tail)
}

// moveParts are the statement that moves outbox rows of schema q (quoted) to
// outbox_published (migration 0008), before and after the condition that picks them; ret
// ends the INSERT.
func moveParts(q, ret string) (head, tail string) {
	const cols = `id, operation_id, pipeline, causation_id, topic, key, payload, headers, created_at`
	return `WITH moved AS (DELETE FROM ` + q + `.outbox WHERE `, ` RETURNING ` + cols + `)
INSERT INTO ` + q + `.outbox_published (` + cols + `) SELECT ` + cols + ` FROM moved` + ret
}

// MovePublishedSQL is the statement with which the relay keeps the rows it published
// (RelayConfig.KeepPublished): it moves the outbox rows of schema for which cond holds to
// outbox_published, whose published_at is the time of the move. idemd-bench runs it to
// load PostgreSQL as the relay does.
func MovePublishedSQL(schema, cond string) string {
	head, tail := moveParts(pgx.Identifier{schema}.Sanitize(), "")
	return head + cond + tail
}

// Published returns how many records this relay has published (tests, logs).
func (r *Relay) Published() int64 { return r.published.Load() }

// Rounds returns how many rounds of this relay published something (the bench: records
// per round).
func (r *Relay) Rounds() int64 { return r.pubRounds.Load() }

// IsLeader reports whether this relay currently holds the leadership.
func (r *Relay) IsLeader() bool { return r.leader.Load() }

// ErrNotLeader is returned by Drain when this relay does not hold the leadership.
var ErrNotLeader = errors.New("outbox: this relay is not the leader")

// drainWaiter is one Drain call: it is released by the first clean round that started
// after round number after.
type drainWaiter struct {
	after uint64
	done  chan error
}

// Drain publishes until no unpublished row is left that was committed before the call, and
// returns nil: it wakes the leader for a round at once rather than waiting for a NOTIFY or
// the next poll, and returns after a round that started after the call found nothing
// else to publish (rows Kafka refuses for good are dead-lettered, as always). It does not
// stop the relay.
//
// A relay whose Run has not yet tried to take the leadership first waits until it did. A
// relay that does not lead returns ErrNotLeader at once, and so does one that stops
// leading while Drain waits: the leader, in this process or another, publishes the rows,
// and waiting for a standby to take over would wait for nothing. Drain returns ctx's error
// when ctx ends first: a broker outage, or a topic that keeps failing while
// MaxFailingFor has not passed, leaves rows behind. The daemon drains on shutdown, after
// the doors stopped writing and before it cancels Run, so that a rolling restart adds no
// publish delay.
func (r *Relay) Drain(ctx context.Context) error {
	select {
	case <-r.decided:
	case <-ctx.Done():
		return fmt.Errorf("outbox: drain: %w", ctx.Err())
	}
	w := &drainWaiter{done: make(chan error, 1)}
	r.mu.Lock()
	if !r.leader.Load() {
		r.mu.Unlock()
		return ErrNotLeader
	}
	w.after = r.rounds
	r.waiters = append(r.waiters, w)
	r.wakeLocked()
	r.mu.Unlock()
	select {
	case err := <-w.done:
		return err
	case <-ctx.Done():
		r.mu.Lock()
		r.waiters = slices.DeleteFunc(r.waiters, func(x *drainWaiter) bool { return x == w })
		r.mu.Unlock()
		return fmt.Errorf("outbox: drain: %w", ctx.Err())
	}
}

// decide records that Run learned whether it leads (Drain waits for it).
func (r *Relay) decide() { r.decidedOnce.Do(func() { close(r.decided) }) }

// wake makes the leader run a round now (the Handoff calls it).
func (r *Relay) wake() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.wakeLocked()
}

// draining reports whether a Drain call waits (for a round that reads the table).
func (r *Relay) draining() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.waiters) > 0
}

// wakeLocked makes the leader run a round now: it ends the leader's idle wait, or, while a
// round runs, makes it skip the next one. r.mu is held.
func (r *Relay) wakeLocked() {
	if r.cancelWait != nil {
		r.cancelWait()
		return
	}
	r.woken = true
}

// startRound numbers a new round.
func (r *Relay) startRound() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rounds++
	return r.rounds
}

// releaseDrains ends the Drain calls waiting since before round n with err.
func (r *Relay) releaseDrains(n uint64, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.waiters = slices.DeleteFunc(r.waiters, func(w *drainWaiter) bool {
		if w.after < n {
			w.done <- err
			return true
		}
		return false
	})
}

// setLeader records whether this relay leads; stepping down ends every Drain call.
func (r *Relay) setLeader(leading bool) {
	r.mu.Lock()
	r.leader.Store(leading)
	r.woken = false
	r.mu.Unlock()
	if leading {
		metrics.RelayLeader.Set(1)
		return
	}
	// The backlog gauges are the leader's: a standby exports none, so that max() over
	// replicas is the new leader's value, never this process's last one.
	metrics.RelayLeader.Set(0)
	metrics.OutboxBacklog.Reset()
	metrics.OutboxOldestAge.Reset()
	r.releaseDrains(^uint64(0), ErrNotLeader)
}

// Run stands by, leads when it can, and publishes until ctx ends; then it closes the
// Kafka writer and the Publishers. It returns nil when ctx ended, or the error of an
// AfterPublish hook.
func (r *Relay) Run(ctx context.Context) error {
	defer r.close()
	// The session the lock is tried on, kept while the relay stands by: a standby polls on
	// one session instead of opening a connection every StandbyPoll.
	var session *pgx.Conn
	defer func() {
		if session != nil {
			session.Close(context.WithoutCancel(ctx))
		}
	}()
	for {
		var err error
		session, err = r.lead(ctx, session)
		r.setLeader(false)
		r.clearFailing()
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

// close closes the Kafka writer (and its connections, when the relay built it) and the
// Publishers; their errors are logged (nothing unpublished is lost: the rows stay in the
// outbox).
func (r *Relay) close() {
	for _, c := range []interface{ Close() error }{r.writer, r.cfg.PubSub, r.cfg.SQS} {
		if c == nil {
			continue
		}
		if err := c.Close(); err != nil {
			r.log.WithError(err).Warn("error closing a publisher of the relay")
		}
	}
	if r.transport != nil {
		r.transport.CloseIdleConnections()
	}
}

type hookError struct{ err error }

func (e hookError) Error() string { return e.err.Error() }

// lead takes the advisory lock on a session of its own and publishes while it holds it. It
// tries the lock on session, the one a standby kept from its last try, or on a new one. When
// the lock is held by someone else it returns the session, to be kept for the next try;
// otherwise it closes the session (which releases the lock, whatever else happened) and
// returns nil, with the reason it stopped leading or could not lead.
func (r *Relay) lead(ctx context.Context, session *pgx.Conn) (standby *pgx.Conn, err error) {
	conn, got, err := r.tryLock(ctx, session)
	if err != nil {
		return nil, err
	}
	if !got {
		r.decide()
		return conn, nil
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{r.channel}.Sanitize()); err != nil {
		return nil, fmt.Errorf("error listening on %s: %w", r.channel, err)
	}
	r.setLeader(true)
	r.decide()
	r.log.Info("relay is the leader: publishing the outbox")
	defer r.log.Info("relay stepped down")
	r.signals.Leading.Signal(struct{}{})
	r.selectDue = true
	if h := r.cfg.Handoff; h != nil {
		h.attach(r.wake, relayHandoffRounds*r.cfg.BatchSize, relayHandoffRounds*relayRoundBytes)
		defer h.detach()
	}
	defer r.dropAhead()
	// The first round does not wait for it: rows may be waiting, or Kafka may be down.
	defer r.warmWriter(ctx)()

	lastStats, lastLockCheck := time.Time{}, time.Now()
	failures := 0
	for {
		if time.Since(lastLockCheck) >= r.cfg.LockCheck {
			// Also what keeps the session from PostgreSQL's idle_session_timeout.
			if err := pingLock(ctx, conn); err != nil {
				return nil, fmt.Errorf("relay lock connection lost: %w", err)
			}
			lastLockCheck = time.Now()
		}
		if time.Since(lastStats) >= r.cfg.StatsInterval {
			r.refreshStats(ctx)
			lastStats = time.Now()
		}
		if time.Since(r.lastFence) >= r.cfg.FloorInterval {
			r.moveFloor(ctx)
			r.lastFence = time.Now()
		}
		n := r.startRound()
		var (
			rd  *round
			err error
		)
		rows, handed := r.takeHanded()
		switch {
		case handed && len(rows) == 0:
			// Woken for rows an earlier round took, with no other reason to read the table.
			rd = &round{FromHandoff: true}
		case handed:
			rd, err = r.publishHanded(ctx, rows)
			r.cfg.Handoff.recycle(rows)
		default:
			r.lastSelect = time.Now()
			rd, err = r.publishRound(ctx)
			// Until a read of the table leaves nothing behind below the handed rows, they wait.
			r.selectDue = err != nil || !(rd.clean() || rd.reachedHandoff)
		}
		if err != nil {
			// The round's rows may not be marked: read from the head again.
			r.dropAhead()
			r.selectDue = true
		}
		var hookErr hookError
		switch {
		case errors.As(err, &hookErr):
			return nil, err
		case ctx.Err() != nil:
			return nil, nil
		case err != nil:
			// The database failed us (reading or marking rows): retry the whole round.
			failures++
			wait := retry.Backoff(r.cfg.BackoffMin, r.cfg.BackoffMax, failures)
			r.log.WithError(err).WithField("retry_in", wait.Seconds()).Warn("error in an outbox round; rows are kept and retried")
			// Still the leader? A dead lock connection means someone else may lead now.
			if err := pingLock(ctx, conn); err != nil {
				return nil, fmt.Errorf("relay lock connection lost: %w", err)
			}
			select {
			case <-ctx.Done():
				return nil, nil
			case <-time.After(wait):
			}
			continue
		}
		failures = 0
		if rd.Published+rd.DeadLettered+len(rd.Failed) > 0 {
			r.signals.Round.Signal(*rd)
		}
		if rd.clean() {
			r.releaseDrains(n, nil)
		}
		if rd.More || len(rd.Failed) > 0 || (rd.FromHandoff && rd.Published > 0) {
			// More may be waiting, or a topic failed (the broker may be gone), or the rows
			// came from the Handoff (which the lock does not guard): check the lock is still
			// ours, then go on with what is not waiting for a retry.
			if err := pingLock(ctx, conn); err != nil {
				return nil, fmt.Errorf("relay lock connection lost: %w", err)
			}
			if rd.More {
				continue
			}
		}
		if err := r.idle(ctx, conn); err != nil {
			return nil, err
		}
	}
}

// idle sleeps until a commit notifies the relay, Drain wakes it, the earliest retry of a
// failing topic is due, or the poll interval passed.
func (r *Relay) idle(ctx context.Context, conn *pgx.Conn) error {
	wait := r.cfg.PollInterval
	if at, ok := r.nextRetry(); ok {
		wait = min(wait, max(time.Until(at), 0))
	}
	r.mu.Lock()
	if r.woken {
		r.woken = false
		r.mu.Unlock()
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	r.cancelWait = cancel
	r.mu.Unlock()
	_, err := conn.WaitForNotification(wctx)
	r.mu.Lock()
	r.cancelWait = nil
	r.mu.Unlock()
	// Why the wait ended, read before cancel() below ends wctx whatever the reason: nil
	// when it was not ended (the connection failed), DeadlineExceeded at the poll interval,
	// Canceled when Drain or a handed row woke the relay, or when ctx ended.
	waitErr := wctx.Err()
	cancel()
	if err == nil || (ctx.Err() == nil && errors.Is(waitErr, context.DeadlineExceeded)) {
		// A NOTIFY (rows written without the Handoff, here or in another process), the poll
		// interval, or a failing destination's retry: the next round reads the table.
		r.selectDue = true
	}
	if err != nil && ctx.Err() == nil && waitErr == nil {
		// The session holding the lock is gone (terminated, the server restarted, the
		// network cut), and with it the lock: another replica may lead now.
		return fmt.Errorf("relay lock connection lost: %w", err)
	}
	return nil
}

func (r *Relay) refreshStats(ctx context.Context) {
	var (
		backlog int64
		age     float64
	)
	if err := queryRowByIndex(ctx, r.pool, r.statsSQL, []any{r.floor}, &backlog, &age); err != nil {
		if ctx.Err() == nil {
			r.log.WithError(err).Warn("error reading outbox backlog")
		}
		return
	}
	metrics.OutboxBacklog.WithLabelValues().Set(float64(backlog))
	metrics.OutboxOldestAge.WithLabelValues().Set(age)
}

// recordHeaders appends the Kafka headers of an event to hs: operation-id, causation-id and
// idemd-pipeline, then its own. Their values are appended to vals and sliced from it, so
// that a round's headers take two allocations rather than one per value (size both with
// headersSize).
func recordHeaders(hs []kafka.Header, vals []byte, op uuid.UUID, causation, pipeline string, extra map[string]string) ([]kafka.Header, []byte) {
	value := func(v string) []byte {
		start := len(vals)
		vals = append(vals, v...)
		return vals[start:len(vals):len(vals)]
	}
	start := len(vals)
	vals = appendUUID(vals, op)
	hs = append(hs,
		kafka.Header{Key: HeaderOperationID, Value: vals[start:len(vals):len(vals)]},
		kafka.Header{Key: HeaderCausationID, Value: value(causation)},
		kafka.Header{Key: HeaderPipeline, Value: value(pipeline)},
	)
	for k, v := range extra {
		switch k {
		case HeaderOperationID, HeaderCausationID, HeaderPipeline:
			continue // ours win: they are what downstream dedupes on
		}
		hs = append(hs, kafka.Header{Key: k, Value: value(v)})
	}
	return hs, vals
}

// headersSize is how many headers, and how many bytes of values, recordHeaders appends for e.
func headersSize(e *Event) (n, bytes int) {
	n, bytes = 3+len(e.Headers), 36+len(e.CausationID)+len(e.Pipeline)
	for _, v := range e.Headers {
		bytes += len(v)
	}
	return n, bytes
}

// appendUUID appends u in its canonical text form, as u.String() writes it.
func appendUUID(dst []byte, u uuid.UUID) []byte {
	var b [36]byte
	hex.Encode(b[0:8], u[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], u[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], u[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], u[8:10])
	b[23] = '-'
	hex.Encode(b[24:], u[10:])
	return append(dst, b[:]...)
}

func relayLockKey(schema string) int64 {
	h := fnv.New64a()
	h.Write([]byte("idemd.relay:" + schema))
	return int64(h.Sum64())
}

// pingLock checks that the lock connection, and so the leadership, is still there. Bounded:
// a half-open connection must not keep an old leader publishing while TCP gives up.
// bindLockToLiveness makes the lock session end, and the lock go to a standby, when this
// process stops using it (LockTimeout) or its host stops answering (TCP keepalives): without
// them a frozen or vanished leader kept the lock until the server's own keepalives gave up,
// two hours by Linux's defaults. A server without idle_session_timeout (before PostgreSQL
// 14) keeps the keepalives alone, and says so.
func (r *Relay) bindLockToLiveness(ctx context.Context, conn *pgx.Conn) error {
	if _, err := conn.Exec(ctx, `SELECT set_config('tcp_keepalives_idle', '10', false),
       set_config('tcp_keepalives_interval', '5', false), set_config('tcp_keepalives_count', '3', false)`); err != nil {
		return fmt.Errorf("error setting the relay lock session's keepalives: %w", err)
	}
	_, err := conn.Exec(ctx, `SELECT set_config('idle_session_timeout', $1, false)`, strconv.FormatInt(r.cfg.LockTimeout.Milliseconds(), 10))
	switch {
	case pgerr.Code(err) == "42704": // undefined_object: no such setting
		if !r.warnedNoIdleTimeout {
			r.warnedNoIdleTimeout = true
			r.log.Warn("PostgreSQL has no idle_session_timeout (before 14): a relay leader that hangs keeps the leadership until its process ends")
		}
	case err != nil:
		return fmt.Errorf("error setting the relay lock session's idle_session_timeout: %w", err)
	}
	return nil
}

// tryLock tries the relay lock on session, or on a new session when session is nil or no
// longer answers (the server ended it: a restart, a standby's idle_session_timeout when
// StandbyPoll is longer than LockTimeout). It returns the session it tried on, open, unless
// it failed.
func (r *Relay) tryLock(ctx context.Context, session *pgx.Conn) (conn *pgx.Conn, got bool, err error) {
	if session != nil {
		if got, err = tryLockOn(ctx, session, r.lockKey); err == nil {
			return session, got, nil
		}
		session.Close(context.WithoutCancel(ctx))
		r.log.WithError(err).Debug("the relay's lock session no longer answers: opening another")
	}
	if conn, err = r.lockSession(ctx); err != nil {
		return nil, false, err
	}
	if got, err = tryLockOn(ctx, conn, r.lockKey); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, false, err
	}
	return conn, got, nil
}

func tryLockOn(ctx context.Context, conn *pgx.Conn, key int64) (got bool, err error) {
	// Bounded, as pingLock is: a standby whose session hangs must not stop trying.
	tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := conn.QueryRow(tctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&got); err != nil {
		return false, fmt.Errorf("error trying the relay lock: %w", err)
	}
	return got, nil
}

// lockSession opens the session the relay tries its lock on and, once it has it, leads on.
func (r *Relay) lockSession(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, r.pool.Config().ConnConfig.Copy())
	if err != nil {
		return nil, fmt.Errorf("error connecting for the relay lock: %w", err)
	}
	if err := r.bindLockToLiveness(ctx, conn); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return conn, nil
}

func pingLock(ctx context.Context, conn *pgx.Conn) error {
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return conn.Ping(pctx)
}

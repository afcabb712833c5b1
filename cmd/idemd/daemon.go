package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sirupsen/logrus"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemd/idemd/admin"
	"github.com/idemd/idemd/config"
	"github.com/idemd/idemd/consumer"
	"github.com/idemd/idemd/internal/brokerenv"
	"github.com/idemd/idemd/internal/metrics"
	"github.com/idemd/idemd/internal/pgarray"
	"github.com/idemd/idemd/internal/pgpool"
	"github.com/idemd/idemd/internal/problemconn"
	"github.com/idemd/idemd/internal/testsignal"
	"github.com/idemd/idemd/migrations"
	"github.com/idemd/idemd/outbox"
	"github.com/idemd/idemd/processed"
	"github.com/idemd/idemd/receiver"
)

// Defaults of daemonConfig.
const (
	shutdownTimeoutDefault = 30 * time.Second
	maxConnsDefault        = 20
)

// daemonConfig configures a daemon. serve and dev fill it from the environment (Env).
type daemonConfig struct {
	// DatabaseURL is the PostgreSQL connection string. Required.
	DatabaseURL string
	// SearchPath, when set, is the search_path of every connection: where the unqualified
	// tables of effect SQL are found. Defaults to the server's.
	SearchPath string
	// MaxConns bounds the connection pool. Defaults to 20.
	MaxConns int32
	// Schema holds idemd's tables. Defaults to "idemd".
	Schema string
	// Brokers are the Kafka bootstrap addresses. Required by the consumer role when a
	// subscription reads Kafka, and by the relay role when the pipelines publish to Kafka
	// (or name no Pub/Sub or SQS target).
	Brokers []string
	// Lookup reads the environment of the Pub/Sub and SQS clients (brokerenv). Defaults to
	// none: pipelines that name those brokers are refused.
	Lookup brokerenv.Lookup
	// CreateTopics creates every topic the pipelines name before serving. Defaults to
	// false (topics are the Kafka operator's).
	CreateTopics bool
	// Pipelines is the validated pipelines file. Required.
	Pipelines *config.File
	// Roles to run. Defaults to rolesDefault.
	Roles []role
	// Migrate applies the migrations at start. Without it, the process waits (not ready)
	// until someone else applied them.
	Migrate bool
	// HTTPAddr is where the receiver listens. Defaults to ":8080".
	HTTPAddr string
	// HTTPMaxConns bounds the receiver's open connections (receiver.ServerConfig.MaxConns).
	// Defaults to the receiver's.
	HTTPMaxConns int
	// HTTPMaxUnverified bounds the request body bytes read before verification
	// (receiver.Config.MaxUnverifiedBytes). Defaults to the receiver's.
	HTTPMaxUnverified int64
	// HTTPMaxBatch and HTTPLinger are the receiver's group commit (receiver.Config.MaxBatch
	// and Linger; a negative HTTPLinger never waits). Default to the receiver's.
	HTTPMaxBatch int
	HTTPLinger   time.Duration
	// TLSCertFile and TLSKeyFile, when both set, make the receiver serve HTTPS with that
	// PEM certificate (chain) and key. Default to plain HTTP.
	TLSCertFile, TLSKeyFile string
	// AdminAddr is where the admin server listens (package admin). Defaults to
	// "127.0.0.1:9090".
	AdminAddr string
	// AdminTokens guard the admin API, console and pprof (admin.ParseTokens). Defaults to
	// none: they answer 401.
	AdminTokens []admin.Token
	// AdminInsecureReads opens the admin reads without a token. Defaults to false.
	AdminInsecureReads bool
	// NewReplayer builds what the admin API replays dead letters with, on the daemon's
	// pool. Defaults to none: replays answer 503.
	NewReplayer func(pool *pgxpool.Pool) admin.Replayer
	// DeadLetterRetention, DeadLetterReplayedRetention and EntityVersionRetention are the
	// pruner's (internal/pruner.Config). Default to the pruner's.
	DeadLetterRetention, DeadLetterReplayedRetention, EntityVersionRetention time.Duration
	// ShutdownTimeout bounds the drain after ctx ends. Defaults to 30 s.
	ShutdownTimeout time.Duration
	// PruneInterval is how often the pruner deletes expired dedup records and old
	// published outbox rows. Defaults to 1 min.
	PruneInterval time.Duration
	// PartitionInterval, when positive, makes the pruner open an epoch (a partition of
	// processed_messages) this often and drop expired epochs whole instead of deleting
	// expired records (processed.Store.PruneEpochs). 0 is off: row by row. serve sets it
	// from IDEMD_PROCESSED_PARTITION_INTERVAL, whose default, auto, is the longest retention
	// of the pipelines.
	PartitionInterval time.Duration
	// FilterMaxBytes, when positive, gives the receiver and the subscriptions a filter of
	// the ids in processed_messages' older epochs that takes at most this many bytes
	// (processed.EpochFilter), kept current while they run. 0 is none: every new id is
	// looked up in the older epochs. serve sets it from IDEMD_PROCESSED_FILTER_MAX_BYTES.
	FilterMaxBytes int64
	// OutboxRetention is how long published outbox rows are kept (with
	// OutboxKeepPublished). Defaults to 24 h.
	OutboxRetention time.Duration
	// OutboxKeepPublished keeps published outbox rows, marked, for OutboxRetention
	// (outbox.RelayConfig.KeepPublished), and tells the admin console so. Defaults to
	// false: the relay deletes a row once the broker has it.
	OutboxKeepPublished bool
	// RelayMaxFailingFor is how long a topic may keep refusing the relay's publishes (missing
	// topic, authorization) before its outbox rows are dead-lettered. Defaults to the
	// relay's (outbox.RelayMaxFailingForDefault).
	RelayMaxFailingFor time.Duration
	// KafkaSessionTimeout is the consumer groups' session and rebalance timeout: how long
	// a dead member keeps its partitions before the group moves them. Defaults to the
	// consumer's (30 s).
	KafkaSessionTimeout time.Duration
	// Logger is the base entry; each part adds its component. Defaults to logrus's
	// standard logger.
	Logger *logrus.Entry
	// OnReady, when set, is called once every role runs, with the addresses actually
	// bound (dev prints its examples there).
	OnReady func(httpAddr, adminAddr string)
	// TracerProvider records the roles' spans (serve and dev pass the one tracing.Setup
	// made from the OTEL_* variables). Defaults to OpenTelemetry's global provider.
	TracerProvider trace.TracerProvider
}

// daemon runs idemd's roles in one process — the HTTP receiver, the Kafka consumers, the
// outbox relay and the pruner — with the admin server beside them. Guarantee: on shutdown
// the roles stop in the order that loses nothing: the receiver stops accepting and finishes
// its in-flight requests, the consumers apply what they hold and commit its offsets, then
// the relay publishes the outbox rows they wrote, all within daemonConfig.ShutdownTimeout;
// Run reports an error when that bound was not met.
type daemon struct {
	cfg     daemonConfig
	log     *logrus.Entry
	admin   *admin.Server
	pool    *pgxpool.Pool
	res     config.Resources
	clients *brokerenv.Clients
	running *runningConsumers
	tls     *tls.Config
	signals daemonSignals
	// handoff passes the rows the receiver and the subscriptions commit to the relay of
	// this process, when it leads (outbox.Handoff).
	handoff *outbox.Handoff
	// filter is the receiver's and the subscriptions' filter of the older epochs' ids,
	// nil without one (FilterMaxBytes 0).
	filter *processed.EpochFilter
	// deadline is when the drain must end, set when it starts; overran, that it did not end
	// by then and left parts stopping (shutdown).
	deadline time.Time
	overran  bool
}

// daemonSignals are the daemon's test signals (internal/testsignal): inert unless a test
// initialised them before Run.
type daemonSignals struct {
	// topicsCreated carries the topics CreateTopics made (or found) before serving.
	topicsCreated testsignal.Signal[[]string]
	// ready carries the receiver's and the admin server's addresses once every role runs.
	ready testsignal.Signal[[2]string]
	// drained carries the outcome of the relay's flush on shutdown (nil: flushed, or not
	// the leader).
	drained testsignal.Signal[error]
}

// newDaemon checks cfg and prepares the connection pool; nothing connects until Run.
func newDaemon(cfg *daemonConfig) (*daemon, error) {
	c := *cfg
	c.Schema = cmp.Or(c.Schema, migrations.SchemaDefault)
	c.MaxConns = cmp.Or(c.MaxConns, maxConnsDefault)
	c.HTTPAddr = cmp.Or(c.HTTPAddr, httpAddrDefault)
	c.AdminAddr = cmp.Or(c.AdminAddr, adminAddrDefault)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, shutdownTimeoutDefault)
	c.PruneInterval = cmp.Or(c.PruneInterval, pruneIntervalDefault)
	c.OutboxRetention = cmp.Or(c.OutboxRetention, outboxRetentionDefault)
	if len(c.Roles) == 0 {
		c.Roles = rolesDefault
	}
	if c.Logger == nil {
		c.Logger = logrus.NewEntry(logrus.StandardLogger())
	}
	var errs []error
	if c.Pipelines == nil {
		errs = append(errs, errors.New("pipelines file is required"))
	}
	if c.DatabaseURL == "" {
		errs = append(errs, errNoDatabaseURL)
	}
	var res config.Resources
	if c.Pipelines != nil {
		res = c.Pipelines.Resources()
	}
	if len(c.Brokers) == 0 {
		if c.has(roleConsumer) && res.KafkaSubscriptions {
			errs = append(errs, errors.New("IDEMD_KAFKA_BROKERS is required by the consumer role: subscriptions read Kafka topics"))
		}
		if c.has(roleRelay) && res.KafkaTargets() {
			errs = append(errs, errors.New("IDEMD_KAFKA_BROKERS is required by the relay role: the pipelines publish to Kafka topics"))
		}
	}
	clients, err := brokerClients(&c, &res)
	if err != nil {
		errs = append(errs, err)
	}
	if c.ShutdownTimeout < 0 {
		errs = append(errs, errors.New("IDEMD_SHUTDOWN_TIMEOUT must be positive"))
	}
	tlsConf, err := receiverTLS(&c)
	if err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		closeClients(clients, c.Logger)
		return nil, errors.Join(errs...)
	}

	pc, err := pgxpool.ParseConfig(c.DatabaseURL)
	if err != nil {
		// pgx's message may quote the URL, password included: say only what is wrong.
		closeClients(clients, c.Logger)
		return nil, errors.New("IDEMD_DATABASE_URL is not a valid PostgreSQL connection string")
	}
	pc.MaxConns = c.MaxConns
	if c.SearchPath != "" {
		pc.ConnConfig.RuntimeParams["search_path"] = c.SearchPath
	}
	// Claims need READ COMMITTED, whatever the database's default (processed.ClaimBatchTx).
	pc.ConnConfig.RuntimeParams["default_transaction_isolation"] = "read committed"
	pc.AfterConnect = pgarray.AfterConnect
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		closeClients(clients, c.Logger)
		return nil, fmt.Errorf("error creating the connection pool: %w", err)
	}
	running := &runningConsumers{}
	adm, err := newAdmin(&c, pool, running)
	if err != nil {
		pool.Close()
		closeClients(clients, c.Logger)
		return nil, err
	}
	var filter *processed.EpochFilter
	if c.FilterMaxBytes > 0 {
		filter = processed.NewEpochFilter(c.Schema, c.FilterMaxBytes)
	}
	return &daemon{
		filter:  filter,
		cfg:     c,
		log:     c.Logger.WithField("component", "daemon"),
		admin:   adm,
		pool:    pool,
		tls:     tlsConf,
		res:     res,
		clients: clients,
		running: running,
		handoff: outbox.NewHandoff(),
	}, nil
}

func (c *daemonConfig) has(r role) bool { return slices.Contains(c.Roles, r) }

// part is one running piece of a role (a role may have several: one consumer per
// subscription; the relay and the HTTP deliverer); stop ends it and waits for it.
type part struct {
	// role decides when the part stops (shutdown goes through the roles in order).
	role role
	// name says which part it is, in logs and errors ("subscription \"ledger\"").
	name string
	done chan struct{}
	err  error
	stop func(ctx context.Context) error
}

// cancelAndWait ends a part that drains when its context is canceled: cancel, then wait for
// its Run to return, or fail when ctx ends first.
func (p *part) cancelAndWait(ctx context.Context, cancel context.CancelFunc) error {
	cancel()
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		return errors.New("did not stop in time")
	}
}

// Run serves until ctx ends, then drains within ShutdownTimeout. It returns nil after a
// clean drain; an error when starting failed, a role failed, or the drain overran.
func (d *daemon) Run(ctx context.Context) error {
	defer d.close()
	defer metrics.WatchPool(d.pool)()
	// Whichever roles this process runs: rows it writes for a broker need a relay leader
	// somewhere (alert IdemdNoRelayLeader).
	if d.res.BrokerTargets() {
		metrics.RelayExpected.Set(1)
	}
	log := d.log

	adminLn, err := listen("IDEMD_ADMIN_ADDR", d.cfg.AdminAddr)
	if err != nil {
		return err
	}
	adminLn = problemconn.Listener(adminLn, admin.ProblemTypeBase)
	adminSrv := d.admin.HTTPServer()
	go func() { _ = adminSrv.Serve(adminLn) }()
	defer adminSrv.Close()

	if err := d.prepare(ctx); err != nil {
		return err
	}

	failed := make(chan *part, 1)
	var parts []*part
	start := func(p *part, run func(ctx context.Context) error) *part {
		p.done = make(chan struct{})
		go func() {
			defer close(p.done)
			if p.err = run(ctx); p.err != nil && !errors.Is(p.err, context.Canceled) {
				select {
				case failed <- p:
				default: // one failure is enough to shut down
				}
			}
		}()
		parts = append(parts, p)
		return p
	}
	stopAll := func() error { return d.shutdown(parts) }

	hasReceiver := d.cfg.has(roleReceiver) && len(d.cfg.Pipelines.Sources) > 0
	if hasReceiver || d.cfg.has(roleConsumer) && len(d.cfg.Pipelines.Consumers()) > 0 {
		d.startFilter(start)
	}
	httpAddr := ""
	if hasReceiver {
		p, addr, err := d.startReceiver(start)
		if err != nil {
			return errors.Join(err, stopAll())
		}
		_, httpAddr = p, addr
	}
	if d.cfg.has(roleConsumer) {
		if err := d.startConsumers(start); err != nil {
			return errors.Join(err, stopAll())
		}
	}
	if d.cfg.has(roleRelay) {
		if err := d.startRelay(start); err != nil {
			return errors.Join(err, stopAll())
		}
		if err := d.startDeliverer(start); err != nil {
			return errors.Join(err, stopAll())
		}
	}
	if d.cfg.has(rolePruner) {
		d.startPruner(start)
	}

	// What OnReady prints (dev's examples) is out before /readyz says ready.
	if d.cfg.OnReady != nil {
		d.cfg.OnReady(httpAddr, adminLn.Addr().String())
	}
	log.WithFields(logrus.Fields{
		"roles": joinRoles(d.cfg.Roles), "http_addr": httpAddr, "admin_addr": adminLn.Addr().String(),
		"sources": len(d.cfg.Pipelines.Sources), "subscriptions": len(d.cfg.Pipelines.Subscriptions),
	}).Info("idemd is serving")
	d.admin.Started()
	d.signals.ready.Signal([2]string{httpAddr, adminLn.Addr().String()})

	var runErr error
	select {
	case <-ctx.Done():
		log.Info("shutdown requested; draining")
	case p := <-failed:
		runErr = fmt.Errorf("%s stopped: %w", p.name, p.err)
		log.WithError(p.err).WithField("role", p.role.String()).WithField("part", p.name).Error("a role stopped; shutting down")
	}
	return errors.Join(runErr, stopAll())
}

// prepare connects, migrates, creates topics, checks the effect SQL and opens the pool's
// connections.
func (d *daemon) prepare(ctx context.Context) error {
	if err := waitForDatabase(ctx, d.pool, d.log); err != nil {
		return err
	}
	if d.cfg.Migrate {
		log := d.log.WithField("schema", d.cfg.Schema)
		err := migrations.Apply(ctx, d.pool, &migrations.Config{Schema: d.cfg.Schema, OnApply: func(_ int32, name string) {
			log.WithField("migration", name).Info("applying migration")
		}})
		if err != nil {
			return err
		}
		log.Info("schema up to date")
	}
	if err := d.cfg.Pipelines.PrepareSQL(ctx, d.pool); err != nil {
		return fmt.Errorf("the pipelines file is not valid:\n%w", err)
	}
	// Pub/Sub subscriptions and SQS queues must exist (idemd creates none); a missing
	// publish target only holds its events.
	problems, warnings, _ := d.checkBrokers(ctx, 0)
	for _, w := range warnings {
		d.log.WithError(w).Warn("a Pub/Sub or SQS resource is not ready")
	}
	if len(problems) > 0 {
		return errors.Join(problems...)
	}
	if d.cfg.CreateTopics && len(d.cfg.Brokers) > 0 {
		topics := d.cfg.Pipelines.Topics()
		if err := createTopics(ctx, d.cfg.Brokers, topics); err != nil {
			return err
		}
		d.signals.topicsCreated.Signal(topics)
	}
	warmPool(ctx, d.pool, d.log)
	return nil
}

// poolWarmTimeout bounds warmPool.
const poolWarmTimeout = 10 * time.Second

// warmPool opens the pool's IDEMD_DB_MAX_CONNS connections before the roles start and
// /readyz says ready (pgpool.Warm). Without it the first burst after a start (the receiver's
// transactions, the NOTIFYs that wake the relay, the relay's rounds) waits for PostgreSQL
// to start a backend per connection, all at once: in idemd-bench's relay under receiver
// load, the first second's 2xx-to-record p99 was 50-316 ms with the pool opened on demand
// and 36-81 ms (mostly about 45) with it opened at start. Best effort: a connection that
// cannot be opened now (max_connections reached) is logged at info level and opened on
// demand later.
func warmPool(ctx context.Context, pool *pgxpool.Pool, log *logrus.Entry) {
	ctx, cancel := context.WithTimeout(ctx, poolWarmTimeout)
	defer cancel()
	failed, err := pgpool.Warm(ctx, pool)
	if failed > 0 && !errors.Is(err, context.Canceled) {
		log.WithError(err).WithField("failures", failed).Info("could not open every database connection at start; the pool opens them on demand")
	}
}

// waitForDatabase pings until the database answers: in a compose file or a pod, idemd
// often starts before PostgreSQL.
func waitForDatabase(ctx context.Context, pool *pgxpool.Pool, log *logrus.Entry) error {
	deadline := time.Now().Add(60 * time.Second)
	for wait := 100 * time.Millisecond; ; wait = min(wait*2, 5*time.Second) {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := pool.Ping(pctx)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the database does not answer: %w", err)
		}
		log.WithError(err).Warn("waiting for the database")
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

type starter func(p *part, run func(ctx context.Context) error) *part

func (d *daemon) startReceiver(start starter) (*part, string, error) {
	cfg := d.cfg.Pipelines.Receiver()
	cfg.Schema = d.cfg.Schema
	cfg.Logger = d.cfg.Logger
	cfg.MaxUnverifiedBytes = d.cfg.HTTPMaxUnverified
	cfg.MaxBatch, cfg.Linger = d.cfg.HTTPMaxBatch, d.cfg.HTTPLinger
	cfg.TracerProvider = d.cfg.TracerProvider
	cfg.Handoff = d.handoff
	cfg.Filter = d.filter
	rcv, err := receiver.New(d.pool, cfg)
	if err != nil {
		return nil, "", fmt.Errorf("error starting the receiver: %w", err)
	}
	ln, err := listen("IDEMD_HTTP_ADDR", d.cfg.HTTPAddr)
	if err != nil {
		rcv.Close()
		return nil, "", err
	}
	ln = d.listenReceiver(ln)
	// The receiver's limits (slow headers, header size, read and write timeouts); the write
	// timeout leaves room for the longest Prefer: wait after the apply timeout.
	srv := receiver.NewServer("", rcv, &receiver.ServerConfig{
		WriteTimeout: cmp.Or(cfg.ApplyTimeout, receiver.ApplyTimeoutDefault) + cmp.Or(cfg.MaxWait, receiver.MaxWaitDefault) + 5*time.Second,
		MaxConns:     d.cfg.HTTPMaxConns,
	})
	p := start(&part{role: roleReceiver, name: "the receiver", stop: func(ctx context.Context) error {
		// Shutdown closes the listener, then waits for the requests in progress: each one
		// is answered after its transaction, so nothing acknowledged is lost.
		err := srv.Shutdown(ctx)
		rcv.Close()
		return err
	}}, func(context.Context) error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	return p, ln.Addr().String(), nil
}

// startFilter keeps the filter of the older epochs' ids current (processed.EpochFilter.Run)
// for the receiver and the subscriptions. It stops with the pruner, after them; claims are
// correct without it, only slower. It looks for a new epoch every
// processed.FilterRefreshDefault, or four times per PartitionInterval when that is shorter
// (tests open epochs every few hundred milliseconds).
func (d *daemon) startFilter(start starter) {
	if d.filter == nil {
		return
	}
	every := processed.FilterRefreshDefault
	if pi := d.cfg.PartitionInterval; pi > 0 {
		every = min(every, max(pi/4, 10*time.Millisecond))
	}
	fctx, cancel := context.WithCancel(context.Background())
	p := &part{role: rolePruner, name: "the epoch filter"}
	p.stop = func(ctx context.Context) error { return p.cancelAndWait(ctx, cancel) }
	log := d.cfg.Logger.WithField("component", "filter")
	start(p, func(context.Context) error {
		return d.filter.Run(fctx, d.pool, every, log, func(processed.FilterRefresh) {
			metrics.ProcessedFilterIDs.Set(float64(d.filter.IDs()))
		})
	})
}

func (d *daemon) startConsumers(start starter) error {
	cfgs := d.cfg.Pipelines.Consumers()
	var consumers []*consumer.Consumer
	for _, cfg := range cfgs {
		if err := d.subscriptionClient(cfg); err != nil {
			return fmt.Errorf("error starting subscription %q: %w", cfg.Name, err)
		}
		cfg.Brokers = d.cfg.Brokers
		cfg.Schema = d.cfg.Schema
		cfg.Logger = d.cfg.Logger
		cfg.SessionTimeout, cfg.RebalanceTimeout = d.cfg.KafkaSessionTimeout, d.cfg.KafkaSessionTimeout
		// The consumer drains inside the daemon's bound, leaving time for the relay.
		cfg.ShutdownTimeout = max(d.cfg.ShutdownTimeout/3, time.Second)
		cfg.TracerProvider = d.cfg.TracerProvider
		cfg.Handoff = d.handoff
		cfg.Filter = d.filter
		c, err := consumer.New(d.pool, cfg)
		if err != nil {
			return fmt.Errorf("error starting subscription %q: %w", cfg.Name, err)
		}
		consumers = append(consumers, c)
		d.running.add(c)
	}
	for _, c := range consumers {
		cctx, cancel := context.WithCancel(context.Background())
		p := &part{role: roleConsumer, name: fmt.Sprintf("subscription %q", c.Name())}
		p.stop = func(ctx context.Context) error { return p.cancelAndWait(ctx, cancel) }
		start(p, func(context.Context) error { return c.Run(cctx) })
	}
	return d.startLagMonitors(start, consumers)
}

func (d *daemon) startRelay(start starter) error {
	pubsubPub, sqsPub, err := d.publishers()
	if err != nil {
		return fmt.Errorf("error starting the relay: %w", err)
	}
	if len(d.cfg.Brokers) == 0 && pubsubPub == nil && sqsPub == nil {
		// Nothing names a broker to publish to (HTTP targets have their deliverer).
		d.log.Info("no Kafka brokers and no Pub/Sub or SQS publish target: the outbox relay is not started")
		return nil
	}
	relay, err := outbox.NewRelay(d.pool, &outbox.RelayConfig{
		Schema:         d.cfg.Schema,
		Brokers:        d.cfg.Brokers,
		PubSub:         pubsubPub,
		SQS:            sqsPub,
		MaxFailingFor:  d.cfg.RelayMaxFailingFor,
		KeepPublished:  d.cfg.OutboxKeepPublished,
		Logger:         d.cfg.Logger.WithField("component", "relay"),
		TracerProvider: d.cfg.TracerProvider,
		Handoff:        d.handoff,
	})
	if err != nil {
		return fmt.Errorf("error starting the relay: %w", err)
	}
	rctx, cancel := context.WithCancel(context.Background())
	p := &part{role: roleRelay, name: "the relay"}
	stopStats := metrics.WatchKafkaWriter(roleRelay.String(), relay)
	p.stop = func(ctx context.Context) error {
		defer stopStats()
		err := d.drainRelay(ctx, relay)
		d.signals.drained.Signal(err)
		return p.cancelAndWait(ctx, cancel)
	}
	start(p, func(context.Context) error { return relay.Run(rctx) })
	return nil
}

// drainRelay flushes the outbox when this process's relay leads: it publishes what the
// receiver and consumers wrote before they stopped, so that a rolling restart adds no
// publish delay. It keeps the last second of ctx for stopping the relay itself. A standby
// has nothing to flush: the leader, in another process, publishes the rows.
func (d *daemon) drainRelay(ctx context.Context, relay *outbox.Relay) error {
	if dl, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, dl.Add(-time.Second))
		defer cancel()
	}
	err := relay.Drain(ctx)
	switch {
	case err == nil:
		d.log.Info("outbox flushed")
	case errors.Is(err, outbox.ErrNotLeader):
		err = nil
	default:
		d.log.WithError(err).Warn("outbox not flushed before the shutdown timeout; the next leader publishes the rest")
	}
	return err
}

// shutdown stops the parts role by role, in the order of the role constants (receiver,
// consumers, relay, pruner); the parts of one role stop together. It returns by the
// shutdown timeout whatever the parts do: a part still stopping then (an effect that
// outlasts the timeout) is abandoned, and d.overran is set so that Run does not wait for it
// either. Abandoning loses nothing: what it had not committed is rolled back when the
// process's connections close, and nothing uncommitted was acknowledged.
func (d *daemon) shutdown(parts []*part) error {
	d.admin.Draining()
	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.ShutdownTimeout)
	defer cancel()
	started := time.Now()
	d.deadline, _ = ctx.Deadline()
	var (
		mu   sync.Mutex
		errs []error
	)
	for r := range role(len(roleNames)) {
		var wg sync.WaitGroup
		for _, p := range parts {
			if p.role != r {
				continue
			}
			wg.Go(func() {
				if err := p.stop(ctx); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("stopping %s: %w", p.name, err))
					mu.Unlock()
				}
			})
		}
		stopped := make(chan struct{})
		go func() { wg.Wait(); close(stopped) }()
		select {
		case <-stopped:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if ctx.Err() != nil {
		d.overran = true
		errs = append(errs, fmt.Errorf("shutdown did not finish within IDEMD_SHUTDOWN_TIMEOUT (%s); what was still running is abandoned, its transactions rolled back", d.cfg.ShutdownTimeout))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	d.log.WithField("duration", time.Since(started).Seconds()).Info("drained; bye")
	return nil
}

// ShutdownDeadline is when the drain must end (zero before it starts): what runs after
// Run returns (the last spans' export) keeps within it.
func (d *daemon) ShutdownDeadline() time.Time { return d.deadline }

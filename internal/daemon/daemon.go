// Package daemon runs idemd's roles in one process — the HTTP receiver, the Kafka
// consumers, the outbox relay and the pruner — with the admin server beside them.
// Guarantee: on shutdown the roles stop in the order that loses nothing: the receiver stops
// accepting and finishes its in-flight requests, the consumers apply what they hold and
// commit its offsets, then the relay publishes the outbox rows they wrote, all within
// Config.ShutdownTimeout; Run reports an error when that bound was not met.
package daemon

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sirupsen/logrus"

	"github.com/idemd/idemd/config"
	"github.com/idemd/idemd/consumer"
	"github.com/idemd/idemd/internal/metrics"
	"github.com/idemd/idemd/migrations"
	"github.com/idemd/idemd/outbox"
	"github.com/idemd/idemd/receiver"
)

// Roles a process can run.
const (
	RoleReceiver = "receiver"
	RoleConsumer = "consumer"
	RoleRelay    = "relay"
	RolePruner   = "pruner"
)

// RolesDefault are the roles of `idemd serve` unless IDEMD_ROLES says otherwise.
var RolesDefault = []string{RoleReceiver, RoleConsumer, RoleRelay, RolePruner}

// Defaults of Config.
const (
	ShutdownTimeoutDefault = 30 * time.Second
	MaxConnsDefault        = 20
	PruneIntervalDefault   = time.Minute
	OutboxRetentionDefault = 24 * time.Hour
)

// Config configures a Daemon. cmd/idemd fills it from the environment.
type Config struct {
	// DatabaseURL is the PostgreSQL connection string. Required.
	DatabaseURL string
	// SearchPath, when set, is the search_path of every connection: where the unqualified
	// tables of effect SQL are found. Defaults to the server's.
	SearchPath string
	// MaxConns bounds the connection pool. Defaults to 20.
	MaxConns int32
	// Schema holds idemd's tables. Defaults to "idemd".
	Schema string
	// Brokers are the Kafka bootstrap addresses. Required by the consumer and relay roles.
	Brokers []string
	// CreateTopics creates every topic the pipelines name before serving. Defaults to
	// false (topics are the Kafka operator's).
	CreateTopics bool
	// Pipelines is the validated pipelines file. Required.
	Pipelines *config.File
	// Roles to run. Defaults to RolesDefault.
	Roles []string
	// Migrate applies the migrations at start. Without it, the process waits (not ready)
	// until someone else applied them.
	Migrate bool
	// HTTPAddr is where the receiver listens. Defaults to ":8080".
	HTTPAddr string
	// TLSCertFile and TLSKeyFile, when both set, make the receiver serve HTTPS with that
	// PEM certificate (chain) and key. Default to plain HTTP.
	TLSCertFile, TLSKeyFile string
	// AdminAddr is where /metrics, /healthz and /readyz are served. Defaults to ":9090".
	AdminAddr string
	// ShutdownTimeout bounds the drain after ctx ends. Defaults to 30 s.
	ShutdownTimeout time.Duration
	// PruneInterval is how often the pruner deletes expired dedup records and old
	// published outbox rows. Defaults to 1 min.
	PruneInterval time.Duration
	// OutboxRetention is how long published outbox rows are kept. Defaults to 24 h.
	OutboxRetention time.Duration
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
}

// Daemon is one idemd process.
type Daemon struct {
	cfg   Config
	log   *logrus.Entry
	admin *admin
	pool  *pgxpool.Pool
	tls   *tls.Config
}

// New checks cfg and prepares the connection pool; nothing connects until Run.
func New(cfg *Config) (*Daemon, error) {
	c := *cfg
	c.Schema = cmp.Or(c.Schema, migrations.SchemaDefault)
	c.MaxConns = cmp.Or(c.MaxConns, MaxConnsDefault)
	c.HTTPAddr = cmp.Or(c.HTTPAddr, ":8080")
	c.AdminAddr = cmp.Or(c.AdminAddr, ":9090")
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, ShutdownTimeoutDefault)
	c.PruneInterval = cmp.Or(c.PruneInterval, PruneIntervalDefault)
	c.OutboxRetention = cmp.Or(c.OutboxRetention, OutboxRetentionDefault)
	if len(c.Roles) == 0 {
		c.Roles = RolesDefault
	}
	if c.Logger == nil {
		c.Logger = logrus.NewEntry(logrus.StandardLogger())
	}
	var errs []error
	for _, r := range c.Roles {
		if !slices.Contains(RolesDefault, r) {
			errs = append(errs, fmt.Errorf("IDEMD_ROLES: unknown role %q (known: %s)", r, strings.Join(RolesDefault, ", ")))
		}
	}
	if c.Pipelines == nil {
		errs = append(errs, errors.New("pipelines file is required"))
	}
	if c.DatabaseURL == "" {
		errs = append(errs, errors.New("IDEMD_DATABASE_URL is required"))
	}
	needsKafka := (c.has(RoleConsumer) && c.Pipelines != nil && len(c.Pipelines.Subscriptions) > 0) || c.has(RoleRelay)
	if needsKafka && len(c.Brokers) == 0 {
		errs = append(errs, errors.New("IDEMD_KAFKA_BROKERS is required by the consumer and relay roles"))
	}
	if c.ShutdownTimeout < 0 {
		errs = append(errs, errors.New("IDEMD_SHUTDOWN_TIMEOUT must be positive"))
	}
	tlsConf, err := receiverTLS(&c)
	if err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}

	pc, err := pgxpool.ParseConfig(c.DatabaseURL)
	if err != nil {
		// pgx's message may quote the URL, password included: say only what is wrong.
		return nil, errors.New("IDEMD_DATABASE_URL is not a valid PostgreSQL connection string")
	}
	pc.MaxConns = c.MaxConns
	if c.SearchPath != "" {
		pc.ConnConfig.RuntimeParams["search_path"] = c.SearchPath
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		return nil, fmt.Errorf("error creating the connection pool: %w", err)
	}
	return &Daemon{
		cfg:   c,
		log:   c.Logger.WithField("component", "daemon"),
		admin: &admin{pool: pool, schema: c.Schema},
		pool:  pool,
		tls:   tlsConf,
	}, nil
}

func (c *Config) has(role string) bool { return slices.Contains(c.Roles, role) }

// Pool is the daemon's connection pool (dev creates its example tables with it).
func (d *Daemon) Pool() *pgxpool.Pool { return d.pool }

// part is one running role; stop ends it and waits for it.
type part struct {
	name string
	done chan struct{}
	err  error
	stop func(ctx context.Context) error
}

// cancelAndWait ends a part that drains when its context is canceled: cancel, then wait for
// its Run to return, or fail with "<what> did not stop in time" when ctx ends first.
func (p *part) cancelAndWait(ctx context.Context, cancel context.CancelFunc, what string) error {
	cancel()
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s did not stop in time", what)
	}
}

// Run serves until ctx ends, then drains within ShutdownTimeout. It returns nil after a
// clean drain; an error when starting failed, a role failed, or the drain overran.
func (d *Daemon) Run(ctx context.Context) error {
	defer d.pool.Close()
	defer metrics.WatchPool(d.pool)()
	log := d.log

	adminLn, err := net.Listen("tcp", d.cfg.AdminAddr)
	if err != nil {
		return fmt.Errorf("error listening on IDEMD_ADMIN_ADDR %s: %w", d.cfg.AdminAddr, err)
	}
	adminSrv := &http.Server{Handler: d.admin.handler(), ReadHeaderTimeout: 5 * time.Second}
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

	httpAddr := ""
	if d.cfg.has(RoleReceiver) && len(d.cfg.Pipelines.Sources) > 0 {
		p, addr, err := d.startReceiver(start)
		if err != nil {
			return errors.Join(err, stopAll())
		}
		_, httpAddr = p, addr
	}
	if d.cfg.has(RoleConsumer) {
		if err := d.startConsumers(start); err != nil {
			return errors.Join(err, stopAll())
		}
	}
	if d.cfg.has(RoleRelay) {
		if err := d.startRelay(start); err != nil {
			return errors.Join(err, stopAll())
		}
		if err := d.startDeliverer(start); err != nil {
			return errors.Join(err, stopAll())
		}
	}
	if d.cfg.has(RolePruner) {
		d.startPruner(start)
	}

	// What OnReady prints (dev's examples) is out before /readyz says ready.
	if d.cfg.OnReady != nil {
		d.cfg.OnReady(httpAddr, adminLn.Addr().String())
	}
	log.WithFields(logrus.Fields{
		"roles": strings.Join(d.cfg.Roles, ","), "http_addr": httpAddr, "admin_addr": adminLn.Addr().String(),
		"sources": len(d.cfg.Pipelines.Sources), "subscriptions": len(d.cfg.Pipelines.Subscriptions),
	}).Info("idemd is serving")
	d.admin.started.Store(true)

	var runErr error
	select {
	case <-ctx.Done():
		log.Info("shutdown requested; draining")
	case p := <-failed:
		runErr = fmt.Errorf("%s stopped: %w", p.name, p.err)
		log.WithError(p.err).WithField("role", p.name).Error("a role stopped; shutting down")
	}
	return errors.Join(runErr, stopAll())
}

// prepare connects, migrates, creates topics and checks the effect SQL.
func (d *Daemon) prepare(ctx context.Context) error {
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
	if d.cfg.CreateTopics && len(d.cfg.Brokers) > 0 {
		if err := CreateTopics(ctx, d.cfg.Brokers, d.cfg.Pipelines.Topics()); err != nil {
			return err
		}
	}
	return nil
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

func (d *Daemon) startReceiver(start starter) (*part, string, error) {
	cfg := d.cfg.Pipelines.Receiver()
	cfg.Schema = d.cfg.Schema
	cfg.Logger = d.cfg.Logger
	rcv, err := receiver.New(d.pool, cfg)
	if err != nil {
		return nil, "", fmt.Errorf("error starting the receiver: %w", err)
	}
	ln, err := net.Listen("tcp", d.cfg.HTTPAddr)
	if err != nil {
		rcv.Close()
		return nil, "", fmt.Errorf("error listening on IDEMD_HTTP_ADDR %s: %w", d.cfg.HTTPAddr, err)
	}
	ln = d.listenReceiver(ln)
	// The receiver's limits (slow headers, header size, read and write timeouts); the write
	// timeout leaves room for the longest Prefer: wait after the apply timeout.
	srv := receiver.NewServer("", rcv, &receiver.ServerConfig{
		WriteTimeout: cmp.Or(cfg.ApplyTimeout, receiver.ApplyTimeoutDefault) + cmp.Or(cfg.MaxWait, receiver.MaxWaitDefault) + 5*time.Second,
	})
	p := start(&part{name: RoleReceiver, stop: func(ctx context.Context) error {
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

func (d *Daemon) startConsumers(start starter) error {
	cfgs := d.cfg.Pipelines.Consumers()
	var consumers []*consumer.Consumer
	for _, cfg := range cfgs {
		cfg.Brokers = d.cfg.Brokers
		cfg.Schema = d.cfg.Schema
		cfg.Logger = d.cfg.Logger
		cfg.SessionTimeout, cfg.RebalanceTimeout = d.cfg.KafkaSessionTimeout, d.cfg.KafkaSessionTimeout
		// The consumer drains inside the daemon's bound, leaving time for the relay.
		cfg.ShutdownTimeout = max(d.cfg.ShutdownTimeout/3, time.Second)
		c, err := consumer.New(d.pool, cfg)
		if err != nil {
			return fmt.Errorf("error starting subscription %q: %w", cfg.Name, err)
		}
		consumers = append(consumers, c)
	}
	for _, c := range consumers {
		cctx, cancel := context.WithCancel(context.Background())
		p := &part{name: RoleConsumer + " " + c.Name()}
		p.stop = func(ctx context.Context) error {
			return p.cancelAndWait(ctx, cancel, fmt.Sprintf("subscription %q", c.Name()))
		}
		start(p, func(context.Context) error { return c.Run(cctx) })
	}
	return d.startLagMonitors(start, consumers)
}

func (d *Daemon) startRelay(start starter) error {
	relay, err := outbox.NewRelay(d.pool, &outbox.RelayConfig{
		Schema:  d.cfg.Schema,
		Brokers: d.cfg.Brokers,
		Logger:  d.cfg.Logger.WithField("component", "relay"),
	})
	if err != nil {
		return fmt.Errorf("error starting the relay: %w", err)
	}
	rctx, cancel := context.WithCancel(context.Background())
	p := &part{name: RoleRelay}
	stopStats := metrics.WatchKafkaWriter(RoleRelay, relay)
	p.stop = func(ctx context.Context) error {
		defer stopStats()
		// Flush: the leader publishes what the receiver and consumers wrote before they
		// stopped, so that a rolling restart adds no publish delay.
		if relay.IsLeader() {
			d.waitOutboxEmpty(ctx)
		}
		return p.cancelAndWait(ctx, cancel, "the relay")
	}
	start(p, func(context.Context) error { return relay.Run(rctx) })
	return nil
}

// waitOutboxEmpty waits until no outbox row is unpublished, or until ctx has less than a
// second left (kept for stopping the relay itself).
func (d *Daemon) waitOutboxEmpty(ctx context.Context) {
	q := "SELECT EXISTS (SELECT 1 FROM " + pgx.Identifier{d.cfg.Schema, "outbox"}.Sanitize() + " WHERE published_at IS NULL)"
	for {
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < time.Second {
			d.log.Warn("outbox not flushed before the shutdown timeout; the next leader publishes the rest")
			return
		}
		var pending bool
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		err := d.pool.QueryRow(qctx, q).Scan(&pending)
		cancel()
		if err == nil && !pending {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// shutdown stops the parts in order: receiver, consumers, relay, pruner.
func (d *Daemon) shutdown(parts []*part) error {
	d.admin.draining.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.ShutdownTimeout)
	defer cancel()
	started := time.Now()
	order := []string{RoleReceiver, RoleConsumer, RoleRelay, RolePruner}
	var errs []error
	for _, role := range order {
		var wg sync.WaitGroup
		var mu sync.Mutex
		for _, p := range parts {
			if p.name != role && !strings.HasPrefix(p.name, role+" ") {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := p.stop(ctx); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("stopping %s: %w", p.name, err))
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
	}
	if ctx.Err() != nil {
		errs = append(errs, fmt.Errorf("shutdown did not finish within IDEMD_SHUTDOWN_TIMEOUT (%s)", d.cfg.ShutdownTimeout))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	d.log.WithField("duration", time.Since(started).Seconds()).Info("drained; bye")
	return nil
}

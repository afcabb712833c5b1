package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os/signal"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/sirupsen/logrus"

	"github.com/idemd/idemd/config"
	"github.com/idemd/idemd/internal/brokerenv"
	"github.com/idemd/idemd/internal/pgarray"
	"github.com/idemd/idemd/internal/tracing"
	"github.com/idemd/idemd/migrations"
)

// version is set at build time: -ldflags "-X main.version=v1.2.3".
var version = ""

// tracingFlushTimeout bounds the export of the last spans at exit, after the drain.
const tracingFlushTimeout = 5 * time.Second

func (c *cli) serve(args []string) int {
	fs := c.flags("serve", "", "Run the roles in IDEMD_ROLES until SIGTERM or SIGINT, then drain within IDEMD_SHUTDOWN_TIMEOUT.", true)
	pipelines := fs.String("pipelines", "", "pipelines file (overrides IDEMD_PIPELINES_FILE)")
	if code, ok := c.parse(fs, args); !ok {
		return code
	}
	if code, ok := c.noArgs(fs); !ok {
		return code
	}
	e, err := loadEnvFor("serve", c.env)
	if err != nil {
		return c.fail("serve", exitUsage, err)
	}
	if *pipelines != "" {
		e.PipelinesFile = *pipelines
	}
	f, err := loadPipelines(e.PipelinesFile, c.env.lookup)
	if err != nil {
		return c.fail("serve", exitUsage, err)
	}
	return c.runDaemon("serve", e, f, nil)
}

// runDaemon runs the daemon until SIGTERM/SIGINT.
func (c *cli) runDaemon(cmd string, e *Env, f *config.File, onReady func(httpAddr, adminAddr string)) int {
	log := newLogger(e, c.stderr)
	for _, w := range unknownVars(c.env) {
		log.WithField("component", "daemon").Warn(w)
	}
	cfg := daemonConfigFrom(e, f, c.env.lookup, log, onReady)
	tr, err := tracing.Setup(context.Background(), &tracing.Config{
		Getenv: c.env.lookup, ServiceVersion: versionString(), Logger: log, Console: c.stderr,
	})
	if err != nil {
		return c.fail(cmd, exitUsage, err)
	}
	// The spans still buffered are exported before exit, within a few seconds and within
	// the shutdown timeout once the drain started.
	var drainDeadline time.Time
	defer func() {
		by := time.Now().Add(tracingFlushTimeout)
		if !drainDeadline.IsZero() && drainDeadline.Before(by) {
			by = drainDeadline
		}
		ctx, cancel := context.WithDeadline(context.Background(), by)
		defer cancel()
		if err := tr.Shutdown(ctx); err != nil {
			log.WithField("component", "tracing").WithError(err).Warn("error flushing the last spans")
		}
	}()
	if tr.Enabled() {
		log.WithField("component", "tracing").Info("tracing is on: spans are exported as the OTEL_* variables say")
	}
	cfg.TracerProvider = tr.TracerProvider()
	d, err := newDaemon(cfg)
	if err != nil {
		return c.fail(cmd, exitUsage, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log.WithField("component", "daemon").WithField("version", versionString()).
		WithField("database", databaseLabel(e.DatabaseURL)).WithField("schema", e.DBSchema).Info("starting idemd")
	switch {
	case len(e.adminTokens) == 0 && e.AdminInsecureReads:
		log.WithField("component", "admin").Warn("IDEMD_ADMIN_TOKEN is not set and IDEMD_ADMIN_INSECURE_READS is true: anyone reaching IDEMD_ADMIN_ADDR reads the admin API and console; writes and /debug/pprof answer 401")
	case len(e.adminTokens) == 0:
		log.WithField("component", "admin").Warn("IDEMD_ADMIN_TOKEN is not set: the admin API, console and pprof answer 401")
	}
	err = d.Run(ctx)
	drainDeadline = d.ShutdownDeadline()
	if err != nil {
		log.WithField("component", "daemon").WithError(err).Error("idemd stopped with an error")
		return exitFailure
	}
	return exitOK
}

// daemonConfigFrom maps the environment onto the daemon's configuration.
func daemonConfigFrom(e *Env, f *config.File, lookup brokerenv.Lookup, log *logrus.Entry, onReady func(string, string)) *daemonConfig {
	return &daemonConfig{
		DatabaseURL:                 e.DatabaseURL,
		Lookup:                      lookup,
		SearchPath:                  e.DBSearchPath,
		MaxConns:                    e.DBMaxConns,
		Schema:                      e.DBSchema,
		Brokers:                     e.KafkaBrokers,
		CreateTopics:                e.KafkaCreateTopics,
		Pipelines:                   f,
		Roles:                       e.roles,
		Migrate:                     e.Migrate,
		HTTPAddr:                    e.HTTPAddr,
		TLSCertFile:                 e.TLSCertFile,
		TLSKeyFile:                  e.TLSKeyFile,
		HTTPMaxConns:                e.HTTPMaxConns,
		HTTPMaxUnverified:           e.HTTPMaxUnverifiedBytes,
		HTTPMaxBatch:                e.HTTPMaxBatch,
		HTTPLinger:                  receiverLinger(e.HTTPLinger),
		AdminAddr:                   e.AdminAddr,
		AdminTokens:                 e.adminTokens,
		AdminInsecureReads:          e.AdminInsecureReads,
		NewReplayer:                 adminReplayer(e, f, log),
		DeadLetterRetention:         e.DeadLetterRetention,
		DeadLetterReplayedRetention: e.DeadLetterReplayed,
		EntityVersionRetention:      e.EntityVersionRetain,
		ShutdownTimeout:             e.ShutdownTimeout,
		PruneInterval:               e.PruneInterval,
		PartitionInterval:           e.PartitionInterval.For(f),
		FilterMaxBytes:              e.FilterMaxBytes,
		OutboxRetention:             e.OutboxRetention,
		OutboxKeepPublished:         e.OutboxKeepPublished,
		KafkaSessionTimeout:         e.KafkaSessionTimeout,
		RelayMaxFailingFor:          e.RelayMaxFailingFor,
		Logger:                      log,
		OnReady:                     onReady,
	}
}

// receiverLinger is receiver.Config.Linger for IDEMD_HTTP_LINGER, whose 0 means never wait
// (the receiver's 0 means its default).
func receiverLinger(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

func (c *cli) migrate(args []string) int {
	fs := c.flags("migrate", "", "Apply the embedded migrations to IDEMD_DB_SCHEMA and exit, printing each migration applied.\n"+
		"Safe to run from many processes at once.", true)
	if code, ok := c.parse(fs, args); !ok {
		return code
	}
	if code, ok := c.noArgs(fs); !ok {
		return code
	}
	e, err := loadEnvFor("migrate", c.env)
	if err != nil {
		return c.fail("migrate", exitUsage, err)
	}
	if e.DatabaseURL == "" {
		return c.fail("migrate", exitUsage, errNoDatabaseURL)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	pool, err := connect(ctx, e)
	if err != nil {
		return c.fail("migrate", exitFailure, err)
	}
	defer pool.Close()
	applied := 0
	err = migrations.Apply(ctx, pool, &migrations.Config{Schema: e.DBSchema, OnApply: func(version int32, name string) {
		applied++
		fmt.Fprintf(c.stdout, "applying %s (version %d)\n", name, version)
	}})
	if err != nil {
		return c.fail("migrate", exitFailure, err)
	}
	st, err := migrations.CurrentStatus(ctx, pool, &migrations.Config{Schema: e.DBSchema})
	if err != nil {
		return c.fail("migrate", exitFailure, err)
	}
	if applied == 0 {
		fmt.Fprintf(c.stdout, "nothing to do: schema %s is already at version %d, the latest\n", e.DBSchema, st.Current)
	} else {
		fmt.Fprintf(c.stdout, "schema %s is at version %d: %d migration(s) applied\n", e.DBSchema, st.Current, applied)
	}
	return exitOK
}

// connect opens a small pool for one-shot commands and checks that the database answers.
func connect(ctx context.Context, e *Env) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(e.DatabaseURL)
	if err != nil {
		return nil, errors.New("IDEMD_DATABASE_URL is not a valid PostgreSQL connection string")
	}
	pc.MaxConns = 2
	if e.DBSearchPath != "" {
		pc.ConnConfig.RuntimeParams["search_path"] = e.DBSearchPath
	}
	pc.AfterConnect = pgarray.AfterConnect
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("error connecting to the database: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("the database at %s does not answer: %w", databaseLabel(e.DatabaseURL), err)
	}
	return pool, nil
}

func (c *cli) check(args []string) int {
	fs := c.flags("check", "", "Validate the environment and the pipelines file as serve does, try the listen addresses serve\n"+
		"would open (and close them), then reach the database (migration status, effect SQL prepared),\n"+
		"the Kafka brokers and the Pub/Sub and SQS resources, all at once and each within 10s. Every\n"+
		"problem is reported at once, and the exit code is 0 exactly when serve would start and become\n"+
		"ready. Warnings (exit 0) are what serve starts with but you probably want to fix: Kafka, Pub/Sub\n"+
		"or SQS unreachable, topics that do not exist, a source whose retention is shorter than its\n"+
		"sender's retry horizon, an IDEMD_* variable idemd does not read (a misspelling).", true)
	pipelines := fs.String("pipelines", "", "pipelines file (overrides IDEMD_PIPELINES_FILE)")
	if code, ok := c.parse(fs, args); !ok {
		return code
	}
	if code, ok := c.noArgs(fs); !ok {
		return code
	}
	var problems, warnings report
	e, err := loadEnvFor("check", c.env)
	problems.add(err)
	if *pipelines != "" {
		e.PipelinesFile = *pipelines
	}
	f, err := config.Load(e.PipelinesFile, c.env.lookup)
	problems.add(pipelinesNotFound(e.PipelinesFile, err))
	if f == nil {
		f = &config.File{} // its problems are reported; check the rest as if it were empty
	}
	for _, w := range unknownVars(c.env) {
		warnings.add(errors.New(w))
	}
	for _, w := range append(f.Warnings(), f.EpochsWarnings(e.PartitionInterval.For(f))...) {
		warnings.add(w)
	}
	// An invalid IDEMD_DB_MAX_CONNS is reported already; its field holds no size to warn about.
	if slices.Contains(e.roles, roleConsumer) && !e.invalid["IDEMD_DB_MAX_CONNS"] {
		for _, w := range f.PoolWarnings(e.DBMaxConns) {
			warnings.add(w)
		}
	}
	// What serve refuses before connecting: roles, the brokers its roles need, the TLS
	// pair, the database URL. The daemon is built and dropped: nothing connects.
	quiet := logrus.New()
	quiet.SetOutput(io.Discard)
	dc := daemonConfigFrom(e, f, c.env.lookup, logrus.NewEntry(quiet), nil)
	problems.add(dc.checkListen())
	d, err := newDaemon(dc)
	problems.add(err)

	// Then the dependencies are reached, all at once and each within its own timeout, so
	// that one that does not answer is reported as that and delays the others' verdicts by
	// nothing: the database, Kafka, and each Pub/Sub and SQS resource.
	timeout := cmp.Or(c.checkTimeout, checkTimeoutDefault)
	var (
		wg                     sync.WaitGroup
		brokers, db, kafkaDeps dependencyReport
	)
	if d != nil {
		wg.Go(func() {
			brokers.problems, brokers.warnings, brokers.reached = d.checkBrokers(context.Background(), timeout)
			d.close()
		})
	}
	if e.DatabaseURL != "" {
		wg.Go(func() { db = checkDatabase(e, f, timeout) })
	}
	if len(e.KafkaBrokers) > 0 {
		wg.Go(func() { kafkaDeps = checkKafkaTopics(e, f, timeout) })
	}
	wg.Wait()
	reached := []string{}
	for _, r := range []dependencyReport{brokers, db, kafkaDeps} { // in this order, whichever answered first
		problems.add(errors.Join(r.problems...))
		for _, w := range r.warnings {
			warnings.add(w)
		}
		reached = append(reached, r.reached...)
	}
	for _, w := range warnings {
		fmt.Fprintf(c.stderr, "warning: %s\n", w) // SPEC 2.3b: a line that starts "warning:"
	}
	if len(problems) > 0 {
		return c.fail("check", exitUsage, errors.New(strings.Join(problems, "\n")))
	}
	fmt.Fprintf(c.stdout, "ok: %s is valid (%d sources, %d subscriptions)", e.PipelinesFile, len(f.Sources), len(f.Subscriptions))
	if len(reached) > 0 {
		fmt.Fprintf(c.stdout, "; %s", strings.Join(reached, "; "))
	}
	fmt.Fprintln(c.stdout, "; serve would start")
	return exitOK
}

// report collects problems one line each, without repeats (serve's checks and check's own
// may find the same one).
type report []string

func (r *report) add(err error) {
	if err == nil {
		return
	}
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range joined.Unwrap() {
			r.add(e)
		}
		return
	}
	for _, line := range strings.Split(err.Error(), "\n") {
		if line = strings.TrimSpace(line); line != "" && !slices.Contains(*r, line) {
			*r = append(*r, line)
		}
	}
}

// checkTimeoutDefault bounds, in check, the reaching of each dependency: the database
// (connection, migration status, effect SQL prepared), the Kafka brokers, each Pub/Sub
// subscription or topic and SQS queue. Each has its own, and they are reached concurrently,
// so that check takes about this long at most, whichever do not answer.
const checkTimeoutDefault = 10 * time.Second

// dependencyReport is what check found reaching one dependency: problems (serve would not
// start or become ready), warnings, and what answered.
type dependencyReport struct {
	problems, warnings []error
	reached            []string
}

// checkDatabase reaches the database as serve would: the connection, the migration status,
// the effect SQL prepared; within timeout.
func checkDatabase(e *Env, f *config.File, timeout time.Duration) (r dependencyReport) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	pool, err := connect(ctx, e)
	if err != nil {
		r.problems = append(r.problems, err)
		return r
	}
	defer pool.Close()
	r.reached = append(r.reached, "the database answers")
	st, err := migrations.CurrentStatus(ctx, pool, &migrations.Config{Schema: e.DBSchema})
	switch {
	case err != nil:
		r.problems = append(r.problems, err)
	case st.Newer() && e.Migrate:
		r.problems = append(r.problems, st.NewerError(e.DBSchema))
	case st.Newer() && !e.invalid["IDEMD_MIGRATE"]:
		r.warnings = append(r.warnings, fmt.Errorf("schema %s is at version %d, migrated by a later idemd than this one (%d): serve starts without migrating, and this version must work on the newer schema (README, Migrations)", e.DBSchema, st.Current, st.Latest))
	case !st.UpToDate() && !e.Migrate && !e.invalid["IDEMD_MIGRATE"]: // an invalid value is reported already
		r.problems = append(r.problems, fmt.Errorf("schema %s is at version %d of %d and IDEMD_MIGRATE=false: serve would not become ready; run idemd migrate", e.DBSchema, st.Current, st.Latest))
	}
	if err := f.PrepareSQL(ctx, pool); err != nil {
		r.problems = append(r.problems, err)
	}
	return r
}

// checkKafkaTopics reaches the Kafka brokers and looks for the pipelines' topics, within
// timeout.
func checkKafkaTopics(e *Env, f *config.File, timeout time.Duration) (r dependencyReport) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	missing, unreachable := checkKafka(ctx, e.KafkaBrokers, f.Topics())
	switch {
	case unreachable != nil && e.KafkaCreateTopics:
		r.problems = append(r.problems, fmt.Errorf("%w (serve creates the topics at start, as IDEMD_KAFKA_CREATE_TOPICS=true, and would fail)", unreachable))
	case unreachable != nil:
		r.warnings = append(r.warnings, fmt.Errorf("%w: serve starts, but its consumers and relay wait for them", unreachable))
	case len(missing) > 0 && !e.KafkaCreateTopics:
		r.warnings = append(r.warnings, fmt.Errorf("kafka topics %s do not exist: serve starts, but nothing is consumed from or published to them until they do (create them, or set IDEMD_KAFKA_CREATE_TOPICS=true)", strings.Join(missing, ", ")))
	default:
		r.reached = append(r.reached, "Kafka answers")
	}
	return r
}

// checkKafka reaches the brokers and lists the topics that do not exist.
func checkKafka(ctx context.Context, brokers, topics []string) (missing []string, unreachable error) {
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	md, err := cl.Metadata(ctx, &kafka.MetadataRequest{Topics: topics})
	if err != nil {
		return nil, fmt.Errorf("the Kafka brokers %s do not answer: %w", strings.Join(brokers, ","), err)
	}
	for _, t := range md.Topics {
		if t.Error != nil {
			missing = append(missing, t.Name)
		}
	}
	slices.Sort(missing)
	return missing, nil
}

func (c *cli) version(args []string) int {
	fs := c.flags("version", "", "Print the version of idemd.", false)
	if code, ok := c.parse(fs, args); !ok {
		return code
	}
	if code, ok := c.noArgs(fs); !ok {
		return code
	}
	fmt.Fprintf(c.stdout, "idemd %s\n", versionString())
	return exitOK
}

func versionString() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "devel"
}

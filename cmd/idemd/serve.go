package main

import (
	"context"
	"errors"
	"fmt"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/sirupsen/logrus"

	"github.com/idemd/idemd/config"
	"github.com/idemd/idemd/internal/daemon"
	"github.com/idemd/idemd/migrations"
)

// version is set at build time: -ldflags "-X main.version=v1.2.3".
var version = ""

func (c *cli) serve(args []string) int {
	fs := c.flags("serve", "", "Run the roles in IDEMD_ROLES until SIGTERM or SIGINT, then drain within IDEMD_SHUTDOWN_TIMEOUT.", true)
	pipelines := fs.String("pipelines", "", "pipelines file (overrides IDEMD_PIPELINES_FILE)")
	if code, ok := c.parse(fs, args); !ok {
		return code
	}
	if fs.NArg() > 0 {
		return c.fail("serve", exitUsage, fmt.Errorf("unexpected arguments %q", fs.Args()))
	}
	e, err := loadEnv(c.env)
	if err != nil {
		return c.fail("serve", exitUsage, err)
	}
	if *pipelines != "" {
		e.PipelinesFile = *pipelines
	}
	f, err := config.Load(e.PipelinesFile, c.env.lookup)
	if err != nil {
		return c.fail("serve", exitUsage, fmt.Errorf("the pipelines file is not valid:\n%w", err))
	}
	return c.runDaemon("serve", e, f, nil)
}

// runDaemon runs the daemon until SIGTERM/SIGINT.
func (c *cli) runDaemon(cmd string, e *Env, f *config.File, onReady func(httpAddr, adminAddr string)) int {
	log := newLogger(e, c.stderr)
	d, err := daemon.New(daemonConfig(e, f, log, onReady))
	if err != nil {
		return c.fail(cmd, exitUsage, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log.WithField("component", "daemon").WithField("version", versionString()).
		WithField("database", databaseLabel(e.DatabaseURL)).WithField("schema", e.DBSchema).Info("starting idemd")
	if err := d.Run(ctx); err != nil {
		log.WithField("component", "daemon").WithError(err).Error("idemd stopped with an error")
		return exitFailure
	}
	return exitOK
}

func daemonConfig(e *Env, f *config.File, log *logrus.Entry, onReady func(string, string)) *daemon.Config {
	return &daemon.Config{
		DatabaseURL:         e.DatabaseURL,
		SearchPath:          e.DBSearchPath,
		MaxConns:            e.DBMaxConns,
		Schema:              e.DBSchema,
		Brokers:             e.KafkaBrokers,
		CreateTopics:        e.KafkaCreateTopics,
		Pipelines:           f,
		Roles:               e.Roles,
		Migrate:             e.Migrate,
		HTTPAddr:            e.HTTPAddr,
		TLSCertFile:         e.TLSCertFile,
		TLSKeyFile:          e.TLSKeyFile,
		HTTPMaxConns:        e.HTTPMaxConns,
		HTTPMaxUnverified:   e.HTTPMaxUnverifiedBytes,
		AdminAddr:           e.AdminAddr,
		ShutdownTimeout:     e.ShutdownTimeout,
		PruneInterval:       e.PruneInterval,
		OutboxRetention:     e.OutboxRetention,
		KafkaSessionTimeout: e.KafkaSessionTimeout,
		Logger:              log,
		OnReady:             onReady,
	}
}

func (c *cli) migrate(args []string) int {
	fs := c.flags("migrate", "", "Apply the embedded migrations to IDEMD_DB_SCHEMA and exit. Safe to run from many processes at once.", true)
	if code, ok := c.parse(fs, args); !ok {
		return code
	}
	e, err := loadEnv(c.env)
	if err != nil {
		return c.fail("migrate", exitUsage, err)
	}
	if e.DatabaseURL == "" {
		return c.fail("migrate", exitUsage, errors.New("IDEMD_DATABASE_URL is required"))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	pool, err := connect(ctx, e)
	if err != nil {
		return c.fail("migrate", exitFailure, err)
	}
	defer pool.Close()
	if err := migrations.Apply(ctx, pool, &migrations.Config{Schema: e.DBSchema}); err != nil {
		return c.fail("migrate", exitFailure, err)
	}
	st, err := migrations.CurrentStatus(ctx, pool, &migrations.Config{Schema: e.DBSchema})
	if err != nil {
		return c.fail("migrate", exitFailure, err)
	}
	fmt.Fprintf(c.stdout, "schema %s is at version %d\n", e.DBSchema, st.Current)
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
	fs := c.flags("check", "", "Validate the environment and the pipelines file, then reach the database (migration status,\n"+
		"effect SQL prepared) and the Kafka brokers. Every problem is reported at once; exit 0 means serve would start.", true)
	pipelines := fs.String("pipelines", "", "pipelines file (overrides IDEMD_PIPELINES_FILE)")
	if code, ok := c.parse(fs, args); !ok {
		return code
	}
	e, err := loadEnv(c.env)
	if err != nil {
		return c.fail("check", exitUsage, err)
	}
	if *pipelines != "" {
		e.PipelinesFile = *pipelines
	}
	var errs []error
	f, err := config.Load(e.PipelinesFile, c.env.lookup)
	if err != nil {
		errs = append(errs, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if e.DatabaseURL == "" {
		errs = append(errs, errors.New("IDEMD_DATABASE_URL is required"))
	} else if pool, err := connect(ctx, e); err != nil {
		errs = append(errs, err)
	} else {
		defer pool.Close()
		st, err := migrations.CurrentStatus(ctx, pool, &migrations.Config{Schema: e.DBSchema})
		switch {
		case err != nil:
			errs = append(errs, err)
		case !st.UpToDate() && !e.Migrate:
			errs = append(errs, fmt.Errorf("schema %s is at version %d of %d and IDEMD_MIGRATE=false: run idemd migrate", e.DBSchema, st.Current, st.Latest))
		}
		if f != nil {
			if err := f.PrepareSQL(ctx, pool); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(e.KafkaBrokers) == 0 {
		errs = append(errs, errors.New("IDEMD_KAFKA_BROKERS is required by the consumer and relay roles"))
	} else if err := checkKafka(ctx, e.KafkaBrokers, f); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return c.fail("check", exitUsage, err)
	}
	fmt.Fprintf(c.stdout, "ok: %s is valid (%d sources, %d subscriptions); database and Kafka answer\n",
		e.PipelinesFile, len(f.Sources), len(f.Subscriptions))
	return exitOK
}

// checkKafka reaches the brokers and reports the topics of the file that do not exist.
func checkKafka(ctx context.Context, brokers []string, f *config.File) error {
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	var topics []string
	if f != nil {
		topics = f.Topics()
	}
	md, err := cl.Metadata(ctx, &kafka.MetadataRequest{Topics: topics})
	if err != nil {
		return fmt.Errorf("the Kafka brokers %v do not answer: %w", brokers, err)
	}
	var errs []error
	for _, t := range md.Topics {
		if t.Error != nil {
			errs = append(errs, fmt.Errorf("kafka topic %s: %w (create it, or set IDEMD_KAFKA_CREATE_TOPICS=true)", t.Name, t.Error))
		}
	}
	return errors.Join(errs...)
}

func (c *cli) version(args []string) int {
	fs := c.flags("version", "", "Print the version of idemd.", false)
	if code, ok := c.parse(fs, args); !ok {
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

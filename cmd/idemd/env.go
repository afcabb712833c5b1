package main

import (
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/sirupsen/logrus"

	"github.com/idemd/idemd/internal/daemon"
	"github.com/idemd/idemd/internal/printable"
)

// Env is idemd's whole environment (prefix IDEMD_). It is the only place that reads it;
// secrets named by the pipelines file are looked up separately, by name.
type Env struct {
	DatabaseURL         string        `env:"DATABASE_URL"`
	KafkaBrokers        []string      `env:"KAFKA_BROKERS" envSeparator:","`
	PipelinesFile       string        `env:"PIPELINES_FILE" envDefault:"idemd.yaml"`
	HTTPAddr            string        `env:"HTTP_ADDR" envDefault:":8080"`
	AdminAddr           string        `env:"ADMIN_ADDR" envDefault:":9090"`
	LogLevel            string        `env:"LOG_LEVEL" envDefault:"info"`
	LogFormat           string        `env:"LOG_FORMAT" envDefault:"json"`
	ShutdownTimeout     time.Duration `env:"SHUTDOWN_TIMEOUT" envDefault:"30s"`
	DBSchema            string        `env:"DB_SCHEMA" envDefault:"idemd"`
	DBMaxConns          int32         `env:"DB_MAX_CONNS" envDefault:"20"`
	DBSearchPath        string        `env:"DB_SEARCH_PATH"`
	Roles               []string      `env:"ROLES" envSeparator:"," envDefault:"receiver,consumer,relay,pruner"`
	Migrate             bool          `env:"MIGRATE" envDefault:"true"`
	KafkaCreateTopics   bool          `env:"KAFKA_CREATE_TOPICS" envDefault:"false"`
	PruneInterval       time.Duration `env:"PRUNE_INTERVAL" envDefault:"1m"`
	OutboxRetention     time.Duration `env:"OUTBOX_RETENTION" envDefault:"24h"`
	KafkaSessionTimeout time.Duration `env:"KAFKA_SESSION_TIMEOUT" envDefault:"30s"`
	TLSCertFile         string        `env:"TLS_CERT_FILE"`
	TLSKeyFile          string        `env:"TLS_KEY_FILE"`
	// 0 means the receiver's defaults (receiver.MaxConnsDefault, MaxUnverifiedBytesDefault).
	HTTPMaxConns           int   `env:"HTTP_MAX_CONNS"`
	HTTPMaxUnverifiedBytes int64 `env:"HTTP_MAX_UNVERIFIED_BYTES"`

	// set records which variables were given, for dev's defaults.
	set map[string]bool
}

// environment is the process environment as a map, for env and for secret lookups.
type environment map[string]string

func newEnvironment(kv []string) environment {
	m := environment{}
	for _, e := range kv {
		if k, v, ok := strings.Cut(e, "="); ok {
			m[k] = v
		}
	}
	return m
}

func (e environment) lookup(name string) (string, bool) {
	v, ok := e[name]
	return v, ok
}

// loadEnv parses and checks the IDEMD_ variables, reporting every problem at once.
func loadEnv(e environment) (*Env, error) {
	cfg := &Env{set: map[string]bool{}}
	if err := env.ParseWithOptions(cfg, env.Options{Prefix: "IDEMD_", Environment: e}); err != nil {
		return nil, envError(err, e)
	}
	for k := range e {
		if strings.HasPrefix(k, "IDEMD_") {
			cfg.set[k] = true
		}
	}
	var errs []error
	if _, err := logrus.ParseLevel(cfg.LogLevel); err != nil {
		errs = append(errs, fmt.Errorf("IDEMD_LOG_LEVEL: %q is not a level (trace, debug, info, warn, error)", cfg.LogLevel))
	}
	if cfg.LogFormat != "json" && cfg.LogFormat != "text" {
		errs = append(errs, fmt.Errorf("IDEMD_LOG_FORMAT: %q is not json or text", cfg.LogFormat))
	}
	if cfg.ShutdownTimeout <= 0 {
		errs = append(errs, errors.New("IDEMD_SHUTDOWN_TIMEOUT must be positive"))
	}
	if cfg.DBMaxConns < 2 {
		errs = append(errs, errors.New("IDEMD_DB_MAX_CONNS must be at least 2"))
	}
	if cfg.KafkaSessionTimeout < 6*time.Second {
		// Brokers refuse shorter sessions by default (group.min.session.timeout.ms).
		errs = append(errs, errors.New("IDEMD_KAFKA_SESSION_TIMEOUT must be at least 6s"))
	}
	if cfg.HTTPMaxConns < 0 || cfg.HTTPMaxUnverifiedBytes < 0 {
		errs = append(errs, errors.New("IDEMD_HTTP_MAX_CONNS and IDEMD_HTTP_MAX_UNVERIFIED_BYTES must not be negative"))
	}
	if cfg.PruneInterval <= 0 || cfg.OutboxRetention <= 0 {
		errs = append(errs, errors.New("IDEMD_PRUNE_INTERVAL and IDEMD_OUTBOX_RETENTION must be positive"))
	}
	roles := cfg.Roles[:0]
	for _, r := range cfg.Roles {
		r = strings.TrimSpace(r)
		if r == "" {
			continue
		}
		known := false
		for _, k := range daemon.RolesDefault {
			known = known || k == r
		}
		if !known {
			errs = append(errs, fmt.Errorf("IDEMD_ROLES: unknown role %q (known: %s)", r, strings.Join(daemon.RolesDefault, ", ")))
		}
		roles = append(roles, r)
	}
	cfg.Roles = roles
	brokers := cfg.KafkaBrokers[:0]
	for _, b := range cfg.KafkaBrokers {
		if b = strings.TrimSpace(b); b != "" {
			brokers = append(brokers, b)
		}
	}
	cfg.KafkaBrokers = brokers
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return cfg, nil
}

// newLogger returns the base entry of every component. Levels and format come from Env;
// stderr receives the logs so that stdout stays for command output.
func newLogger(cfg *Env, w io.Writer) *logrus.Entry {
	l := logrus.New()
	if cfg.LogFormat != "text" {
		// Logs carry sender-controlled ids and (at debug) payloads: encoding/json leaves C1
		// controls and bidi overrides raw, so they are escaped before reaching a terminal.
		// The text format quotes such values itself.
		w = printable.JSONWriter(w)
	}
	l.SetOutput(w)
	level, _ := logrus.ParseLevel(cfg.LogLevel)
	l.SetLevel(level)
	if cfg.LogFormat == "text" {
		l.SetFormatter(&logrus.TextFormatter{FullTimestamp: true})
	} else {
		l.SetFormatter(&logrus.JSONFormatter{TimestampFormat: time.RFC3339Nano})
	}
	// Libraries that log through the standard logger get the same settings.
	logrus.SetOutput(w)
	logrus.SetLevel(level)
	logrus.SetFormatter(l.Formatter)
	return logrus.NewEntry(l)
}

// databaseLabel names a connection string's database for logs and messages: host, port,
// user and database as PostgreSQL parsed them, in libpq's key=value form (psql accepts
// it). Nothing else of the string is shown: a password may sit in a URL's user info, in a
// ?password= parameter or in a key=value password= item, and other parameters may hold
// secrets too (sslpassword, a passfile's path).
func databaseLabel(conn string) string {
	cfg, err := pgconn.ParseConfig(conn)
	if err != nil {
		return "(IDEMD_DATABASE_URL does not parse)"
	}
	return fmt.Sprintf("host=%s port=%d user=%s dbname=%s", cfg.Host, cfg.Port, cfg.User, cfg.Database)
}

// envError names the variable and its bad value rather than the Go field env reports.
func envError(err error, e environment) error {
	var agg env.AggregateError
	if !errors.As(err, &agg) {
		return fmt.Errorf("invalid environment: %w", err)
	}
	t := reflect.TypeFor[Env]()
	var errs []error
	for _, one := range agg.Errors {
		var pe env.ParseError
		if errors.As(one, &pe) {
			if f, ok := t.FieldByName(pe.Name); ok {
				name := "IDEMD_" + strings.Split(f.Tag.Get("env"), ",")[0]
				errs = append(errs, fmt.Errorf("%s: %q is not a valid %s", name, e[name], pe.Type))
				continue
			}
		}
		errs = append(errs, one)
	}
	return errors.Join(errs...)
}

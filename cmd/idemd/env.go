package main

import (
	"cmp"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemd/idemd/admin"
	"github.com/idemd/idemd/config"
	"github.com/idemd/idemd/internal/tracing"
	"github.com/idemd/idemd/pipeline"
	"github.com/idemd/idemd/processed"
)

// Env is idemd's whole environment (prefix IDEMD_). It is the only place that reads it;
// secrets named by the pipelines file are looked up separately, by name.
//
// Each field's tags say everything the help needs: cmds lists the commands that read the
// variable (only their --help shows it, and only they report its problems; "dlq" stands for
// each of its subcommands, "dlq replay" for that one), help is its
// line in --help, envDefault its default. Tests check --help and the README against them.
type Env struct {
	DatabaseURL         string            `env:"DATABASE_URL" cmds:"serve,dev,check,migrate,dlq,inspect" help:"PostgreSQL connection string (required; dev: postgres://postgres@127.0.0.1:5432/test)"`
	KafkaBrokers        []string          `env:"KAFKA_BROKERS" envSeparator:"," cmds:"serve,dev,check,dlq replay" help:"comma-separated Kafka brokers (required by the consumer and relay roles; dev: an in-memory broker)"`
	PipelinesFile       string            `env:"PIPELINES_FILE" envDefault:"idemd.yaml" cmds:"serve,dev,check,dlq replay,sign" help:"the pipelines file (dev and sign: the embedded deploy/idemd.dev.yaml; dlq replay too, on a schema dev ran on, when idemd.yaml does not exist)"`
	HTTPAddr            string            `env:"HTTP_ADDR" envDefault:":8080" cmds:"serve,dev,check,sign" help:"address of the receiver (HTTP sources)"`
	AdminAddr           string            `env:"ADMIN_ADDR" envDefault:"127.0.0.1:9090" cmds:"serve,dev,check" help:"address of the admin server: /metrics, /healthz, /readyz (open), the admin API, console and pprof (token); Kubernetes: :9090"`
	AdminToken          string            `env:"ADMIN_TOKEN" cmds:"serve,dev,check" help:"admin token, or name:token pairs, for the admin API, console and pprof (default: none, they answer 401; dev: one made for the run)"`
	AdminInsecureReads  bool              `env:"ADMIN_INSECURE_READS" envDefault:"false" cmds:"serve,dev,check" help:"let admin reads through without a token; writes and /debug/pprof stay refused"`
	LogLevel            string            `env:"LOG_LEVEL" envDefault:"info" cmds:"serve,dev,check,dlq,inspect" help:"trace, debug, info, warning or error"`
	LogFormat           string            `env:"LOG_FORMAT" envDefault:"json" cmds:"serve,dev,check,dlq,inspect" help:"json or text (dev: text)"`
	ShutdownTimeout     time.Duration     `env:"SHUTDOWN_TIMEOUT" envDefault:"30s" cmds:"serve,dev,check" help:"bound of the drain after SIGTERM"`
	DBSchema            string            `env:"DB_SCHEMA" envDefault:"idemd" cmds:"serve,dev,check,migrate,dlq,inspect" help:"schema of idemd's tables"`
	DBMaxConns          int32             `env:"DB_MAX_CONNS" envDefault:"20" cmds:"serve,dev,check" help:"connection pool size (at least 2)"`
	DBSearchPath        string            `env:"DB_SEARCH_PATH" cmds:"serve,dev,check,migrate,dlq,inspect" help:"search_path of every connection, where effect SQL finds unqualified tables (default: the server's)"`
	Roles               []string          `env:"ROLES" envSeparator:"," envDefault:"receiver,consumer,relay,pruner" cmds:"serve,dev,check" help:"roles this process runs"`
	Migrate             bool              `env:"MIGRATE" envDefault:"true" cmds:"serve,dev,check" help:"apply the migrations at start (false: stay not ready until someone ran idemd migrate)"`
	KafkaCreateTopics   bool              `env:"KAFKA_CREATE_TOPICS" envDefault:"false" cmds:"serve,dev,check" help:"create the topics the pipelines name at start (dev: true)"`
	PruneInterval       time.Duration     `env:"PRUNE_INTERVAL" envDefault:"1m" cmds:"serve,dev,check" help:"how often the pruner deletes expired rows"`
	PartitionInterval   partitionInterval `env:"PROCESSED_PARTITION_INTERVAL" envDefault:"auto" cmds:"serve,dev,check" help:"open a partition (an epoch) of processed_messages this often and drop each one whole once all its records expired, instead of deleting expired records row by row (auto: the longest dedup retention of the pipelines; 0: off, row by row)"`
	FilterMaxBytes      int64             `env:"PROCESSED_FILTER_MAX_BYTES" envDefault:"67108864" cmds:"serve,dev,check" help:"memory for the filter of the ids in processed_messages' older epochs, which spares a new id their lookup (about 1.2 bytes per id); when they need more, every new id is looked up; 0: no filter"`
	OutboxRetention     time.Duration     `env:"OUTBOX_RETENTION" envDefault:"24h" cmds:"serve,dev,check" help:"how long published outbox rows (with IDEMD_OUTBOX_KEEP_PUBLISHED) and finished HTTP deliveries are kept"`
	OutboxKeepPublished bool              `env:"OUTBOX_KEEP_PUBLISHED" envDefault:"false" cmds:"serve,dev,check,inspect" help:"keep published outbox rows, with their publication time, in the table outbox_published for IDEMD_OUTBOX_RETENTION (the console and inspect show them); false: a row is deleted once the broker has it, one write per row instead of two"`
	KafkaSessionTimeout time.Duration     `env:"KAFKA_SESSION_TIMEOUT" envDefault:"30s" cmds:"serve,dev,check" help:"consumer groups' session and rebalance timeout (at least 6s)"`
	RelayMaxFailingFor  time.Duration     `env:"RELAY_MAX_FAILING_FOR" envDefault:"10m" cmds:"serve,dev,check" help:"a topic refusing every publish this long has its outbox rows dead-lettered (negative: never)"`
	DeadLetterRetention time.Duration     `env:"DEAD_LETTER_RETENTION" envDefault:"720h" cmds:"serve,dev,check" help:"how long dead letters (replayed or not) and the admin audit are kept"`
	DeadLetterReplayed  time.Duration     `env:"DEAD_LETTER_REPLAYED_RETENTION" envDefault:"168h" cmds:"serve,dev,check" help:"how long a dead letter is kept after its replay"`
	EntityVersionRetain time.Duration     `env:"ENTITY_VERSION_RETENTION" envDefault:"720h" cmds:"serve,dev,check" help:"how long the stale-event guard keeps an entity's last version after its last update"`
	TLSCertFile         string            `env:"TLS_CERT_FILE" cmds:"serve,dev,check,sign" help:"PEM certificate (chain) of the receiver: it serves HTTPS (with IDEMD_TLS_KEY_FILE)"`
	TLSKeyFile          string            `env:"TLS_KEY_FILE" cmds:"serve,dev,check" help:"PEM private key of IDEMD_TLS_CERT_FILE"`
	// The defaults are receiver.MaxConnsDefault, MaxUnverifiedBytesDefault, MaxBatchDefault
	// and LingerDefault (a test holds them equal).
	HTTPMaxConns           int           `env:"HTTP_MAX_CONNS" envDefault:"1024" cmds:"serve,dev,check" help:"receiver connections open at once, idle ones included; one more is closed as soon as it is accepted"`
	HTTPMaxUnverifiedBytes int64         `env:"HTTP_MAX_UNVERIFIED_BYTES" envDefault:"67108864" cmds:"serve,dev,check" help:"request body bytes read before their signature or token is checked, all requests together; a request that does not fit gets 503"`
	HTTPMaxBatch           int           `env:"HTTP_MAX_BATCH" envDefault:"128" cmds:"serve,dev,check" help:"webhook requests one transaction may carry (group commit; 1: one transaction per request)"`
	HTTPLinger             time.Duration `env:"HTTP_LINGER" envDefault:"2ms" cmds:"serve,dev,check" help:"the most a batch of webhooks waits for more requests while other batches are committing, once per batch; half the recent transactions' mean duration when shorter (0: never)"`

	// set records which variables were given, for dev's defaults.
	set map[string]bool
	// roles are the parsed Roles.
	roles []role
	// adminTokens is AdminToken parsed (by its check).
	adminTokens []admin.Token
	// invalid records the variables that did not parse or pass their check: their fields
	// hold zero values, which must not be reported as what the user set.
	invalid map[string]bool
}

// partitionInterval is IDEMD_PROCESSED_PARTITION_INTERVAL: auto, 0 (off: expired dedup
// records are deleted row by row) or the interval of epochs.
type partitionInterval struct {
	auto bool
	d    time.Duration
}

// UnmarshalText parses auto or a duration.
func (p *partitionInterval) UnmarshalText(b []byte) error {
	if string(b) == "auto" {
		*p = partitionInterval{auto: true}
		return nil
	}
	d, err := time.ParseDuration(string(b))
	*p = partitionInterval{d: d}
	return err
}

// For is the interval of epochs for the pipelines of f: auto is the longest dedup
// retention among them / processed.EpochsPerRetention (the default retention's when f has
// no pipeline), so that two or three epochs are live.
func (p partitionInterval) For(f *config.File) time.Duration {
	if !p.auto {
		return p.d
	}
	return cmp.Or(f.LongestRetention(), pipeline.RetentionDefault) / processed.EpochsPerRetention
}

// String is how logs and warnings name the setting.
func (p partitionInterval) String() string {
	if p.auto {
		return "auto"
	}
	return p.d.String()
}

// envVar is one variable of Env, as its tags describe it.
type envVar struct {
	Name, Default, Help string
	Commands            []string
	field               reflect.StructField
}

// envVars lists Env's variables in declaration order.
func envVars() []envVar {
	t := reflect.TypeFor[Env]()
	var out []envVar
	for i := range t.NumField() {
		f := t.Field(i)
		tag, ok := f.Tag.Lookup("env")
		if !ok {
			continue
		}
		out = append(out, envVar{
			Name:     "IDEMD_" + strings.Split(tag, ",")[0],
			Default:  f.Tag.Get("envDefault"),
			Help:     f.Tag.Get("help"),
			Commands: strings.Split(f.Tag.Get("cmds"), ","),
			field:    f,
		})
	}
	return out
}

// readBy reports whether command cmd ("dlq list" for a subcommand) reads v ("" stands for
// every command): v names it, or its command (every subcommand of "dlq" reads a variable
// that names "dlq").
func (v envVar) readBy(cmd string) bool {
	top, _, _ := strings.Cut(cmd, " ")
	return cmd == "" || slices.Contains(v.Commands, cmd) || slices.Contains(v.Commands, top)
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

// atLeast checks a whole-number variable against its lower bound.
func atLeast[T int | int32 | int64](name string, v, least T) error {
	if v < least {
		return fmt.Errorf("%s: %d is too small: it must be at least %d", name, v, least)
	}
	return nil
}

// loadEnv parses and checks every IDEMD_ variable, reporting every problem at once.
func loadEnv(e environment) (*Env, error) { return loadEnvFor("", e) }

// loadEnvFor parses the IDEMD_ variables and checks those that command cmd reads,
// reporting every problem of those at once, in plain words. The returned Env is never nil:
// variables that did not parse keep their zero value, so that check can go on with the
// others.
func loadEnvFor(cmd string, e environment) (*Env, error) {
	cfg := &Env{set: map[string]bool{}}
	vars := envVars()
	problems := map[string]error{}
	if err := env.ParseWithOptions(cfg, env.Options{Prefix: "IDEMD_", Environment: e}); err != nil {
		unexplained := parseProblems(err, e, vars, problems)
		if unexplained != nil {
			return cfg, unexplained
		}
	}
	for k := range e {
		if strings.HasPrefix(k, "IDEMD_") {
			cfg.set[k] = true
		}
	}
	cfg.Roles = trimmed(cfg.Roles)
	cfg.KafkaBrokers = trimmed(cfg.KafkaBrokers)
	for name, check := range envChecks {
		if problems[name] == nil {
			problems[name] = check(cfg)
		}
	}
	cfg.invalid = map[string]bool{}
	for name, err := range problems {
		if err != nil {
			cfg.invalid[name] = true
		}
	}
	var errs []error
	for _, v := range vars {
		if v.readBy(cmd) && problems[v.Name] != nil {
			errs = append(errs, problems[v.Name])
		}
	}
	if cmd == "" || slices.Contains(tracingCommands, cmd) {
		errs = append(errs, tracing.Check(e.lookup)) // the OTEL_* variables
	}
	return cfg, errors.Join(errs...)
}

// errNoDatabaseURL: every command but dev needs IDEMD_DATABASE_URL (dev defaults to the
// local server).
var errNoDatabaseURL = errors.New("IDEMD_DATABASE_URL is required")

// envChecks are the checks beyond parsing, by variable.
var envChecks = map[string]func(*Env) error{
	"IDEMD_LOG_LEVEL": func(c *Env) error {
		_, err := parseLevel(c.LogLevel)
		return err
	},
	"IDEMD_LOG_FORMAT": func(c *Env) error {
		if c.LogFormat != "json" && c.LogFormat != "text" {
			return fmt.Errorf("IDEMD_LOG_FORMAT: %q is not json or text", c.LogFormat)
		}
		return nil
	},
	"IDEMD_SHUTDOWN_TIMEOUT": func(c *Env) error { return positive("IDEMD_SHUTDOWN_TIMEOUT", c.ShutdownTimeout) },
	"IDEMD_PRUNE_INTERVAL":   func(c *Env) error { return positive("IDEMD_PRUNE_INTERVAL", c.PruneInterval) },
	"IDEMD_OUTBOX_RETENTION": func(c *Env) error { return positive("IDEMD_OUTBOX_RETENTION", c.OutboxRetention) },
	"IDEMD_PROCESSED_PARTITION_INTERVAL": func(c *Env) error {
		if c.PartitionInterval.d < 0 {
			return fmt.Errorf("IDEMD_PROCESSED_PARTITION_INTERVAL: must not be negative (auto: the longest retention; 0 turns partitions off), got %s", c.PartitionInterval.d)
		}
		return nil
	},
	"IDEMD_PROCESSED_FILTER_MAX_BYTES": func(c *Env) error {
		return atLeast("IDEMD_PROCESSED_FILTER_MAX_BYTES", c.FilterMaxBytes, 0)
	},
	"IDEMD_DEAD_LETTER_RETENTION": func(c *Env) error {
		return positive("IDEMD_DEAD_LETTER_RETENTION", c.DeadLetterRetention)
	},
	"IDEMD_DEAD_LETTER_REPLAYED_RETENTION": func(c *Env) error {
		return positive("IDEMD_DEAD_LETTER_REPLAYED_RETENTION", c.DeadLetterReplayed)
	},
	"IDEMD_ENTITY_VERSION_RETENTION": func(c *Env) error {
		return positive("IDEMD_ENTITY_VERSION_RETENTION", c.EntityVersionRetain)
	},
	// The token's problems are told without the token.
	"IDEMD_ADMIN_TOKEN": func(c *Env) error {
		tokens, err := admin.ParseTokens(c.AdminToken)
		if err != nil {
			return fmt.Errorf("IDEMD_ADMIN_TOKEN: %w", err)
		}
		c.adminTokens = tokens
		return nil
	},
	"IDEMD_HTTP_MAX_CONNS":            func(c *Env) error { return atLeast("IDEMD_HTTP_MAX_CONNS", c.HTTPMaxConns, 1) },
	"IDEMD_HTTP_MAX_UNVERIFIED_BYTES": func(c *Env) error { return atLeast("IDEMD_HTTP_MAX_UNVERIFIED_BYTES", c.HTTPMaxUnverifiedBytes, 1) },
	"IDEMD_HTTP_MAX_BATCH":            func(c *Env) error { return atLeast("IDEMD_HTTP_MAX_BATCH", c.HTTPMaxBatch, 1) },
	"IDEMD_HTTP_LINGER": func(c *Env) error {
		if c.HTTPLinger < 0 {
			return fmt.Errorf("IDEMD_HTTP_LINGER: %s is negative: it must be 0 (never wait) or more", c.HTTPLinger)
		}
		return nil
	},
	"IDEMD_DB_MAX_CONNS": func(c *Env) error { return atLeast("IDEMD_DB_MAX_CONNS", c.DBMaxConns, 2) },
	"IDEMD_KAFKA_SESSION_TIMEOUT": func(c *Env) error {
		if c.KafkaSessionTimeout < 6*time.Second {
			// Brokers refuse shorter sessions by default (group.min.session.timeout.ms).
			return fmt.Errorf("IDEMD_KAFKA_SESSION_TIMEOUT: %s is too short: it must be at least 6s (the brokers' usual minimum)", c.KafkaSessionTimeout)
		}
		return nil
	},
	"IDEMD_ROLES": func(c *Env) error {
		var err error
		c.roles, err = parseRoles(c.Roles)
		return err
	},
}

func positive(name string, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("%s: %s is not a positive duration", name, d)
	}
	return nil
}

// trimmed drops the blanks of a comma list.
func trimmed(list []string) []string {
	out := list[:0]
	for _, s := range list {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// parseProblems records, by variable, what env could not parse, named by the variable and
// its value in plain words rather than by the Go field and type. It returns the errors it
// cannot attribute to a variable.
func parseProblems(err error, e environment, vars []envVar, problems map[string]error) error {
	var agg env.AggregateError
	if !errors.As(err, &agg) {
		return fmt.Errorf("invalid environment: %w", err)
	}
	var rest []error
	for _, one := range agg.Errors {
		var pe env.ParseError
		if errors.As(one, &pe) {
			if i := slices.IndexFunc(vars, func(v envVar) bool { return v.field.Name == pe.Name }); i >= 0 {
				v := vars[i]
				problems[v.Name] = fmt.Errorf("%s: %q is not %s", v.Name, e[v.Name], kindWords(v.field.Type))
				continue
			}
		}
		rest = append(rest, one)
	}
	return errors.Join(rest...)
}

// kindWords says what a variable of type t takes, for people rather than Go programmers.
func kindWords(t reflect.Type) string {
	switch {
	case t == reflect.TypeFor[time.Duration]():
		return "a duration (such as 500ms, 30s, 5m or 24h)"
	case t == reflect.TypeFor[partitionInterval]():
		return "auto, 0 (off) or a duration (such as 24h or 168h)"
	case t.Kind() == reflect.Bool:
		return "true or false"
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		return "a whole number"
	}
	return "a valid value"
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

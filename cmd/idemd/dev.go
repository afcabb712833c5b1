package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sirupsen/logrus"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idemd/idemd/admin"
	"github.com/idemd/idemd/config"
	"github.com/idemd/idemd/deploy"
	"github.com/idemd/idemd/internal/brokerenv"
)

// Development-only defaults. They are used by `idemd dev` (and `idemd sign` without a
// pipelines file) and by nothing else.
const (
	databaseURLDev = "postgres://postgres@127.0.0.1:5432/test"
	secretEnvDev   = "STRIPE_WEBHOOK_SECRET"
	secretDev      = "whsec_dev_only_not_a_secret"
	tokensEnvDev   = "ORDERS_TOKENS"
	tokensDev      = "dev-token-acme-not-secret=acme,dev-token-globex-not-secret=globex"
	devPipelineSrc = "deploy/idemd.dev.yaml (embedded)"
	kafkaPortDev   = 9092
)

// devPipelines loads the pipelines file the user gave, or dev's embedded one with
// development secrets for the variables it names that are unset. dev reports which.
func devPipelines(e *Env, env environment) (*config.File, bool, error) {
	if e.set["IDEMD_PIPELINES_FILE"] {
		f, err := loadPipelines(e.PipelinesFile, env.lookup)
		if err != nil {
			return nil, false, err
		}
		return f, false, nil
	}
	lookup := func(name string) (string, bool) {
		if v, ok := env[name]; ok && v != "" {
			return v, true
		}
		switch name {
		case secretEnvDev:
			return secretDev, true
		case tokensEnvDev:
			return tokensDev, true
		}
		return "", false
	}
	f, err := config.Parse(devPipelineSrc, deploy.DevPipelines, lookup)
	if err != nil {
		return nil, false, fmt.Errorf("the dev pipelines file is not valid:\n%w", err)
	}
	return f, true, nil
}

func (c *cli) dev(args []string) int {
	fs := c.flags("dev", "", "One-command local run. Applies the migrations, starts an in-memory Kafka-protocol broker\n"+
		"(development only: nothing survives a restart) unless IDEMD_KAFKA_BROKERS is set, and in-memory\n"+
		"Pub/Sub and SQS fakes (pstest, goaws) for pipelines that name them unless PUBSUB_EMULATOR_HOST or\n"+
		"AWS_ENDPOINT_URL_SQS is set, creating their topics, subscriptions and queues; serves the\n"+
		"example pipelines of deploy/idemd.dev.yaml (or IDEMD_PIPELINES_FILE), creates their effect\n"+
		"tables, and prints example requests ready to paste. IDEMD_DATABASE_URL defaults to\n"+databaseURLDev+".", true)
	pipelines := fs.String("pipelines", "", "pipelines file (overrides IDEMD_PIPELINES_FILE and the dev example)")
	if code, ok := c.parse(fs, args); !ok {
		return code
	}
	if code, ok := c.noArgs(fs); !ok {
		return code
	}
	e, err := loadEnvFor("dev", c.env)
	if err != nil {
		return c.fail("dev", exitUsage, err)
	}
	if *pipelines != "" {
		e.PipelinesFile, e.set["IDEMD_PIPELINES_FILE"] = *pipelines, true
	}
	if e.DatabaseURL == "" {
		e.DatabaseURL = databaseURLDev
	}
	if !e.set["IDEMD_LOG_FORMAT"] {
		e.LogFormat = "text"
	}
	if !e.set["IDEMD_KAFKA_CREATE_TOPICS"] {
		e.KafkaCreateTopics = true
	}
	// The console needs a token: dev makes one for this run unless IDEMD_ADMIN_TOKEN is set,
	// and prints it with the console's address.
	devToken := ""
	if e.AdminToken == "" {
		devToken = "dev-" + strings.ReplaceAll(uuid.NewString(), "-", "")
		e.AdminToken = devToken
		if e.adminTokens, err = admin.ParseTokens(devToken); err != nil {
			return c.fail("dev", exitFailure, err)
		}
	}
	f, example, err := devPipelines(e, c.env)
	if err != nil {
		return c.fail("dev", exitUsage, err)
	}
	log := newLogger(e, c.stderr).WithField("component", "dev")

	inMemory := len(e.KafkaBrokers) == 0
	if inMemory {
		cluster, err := startDevBroker(f.Topics())
		if err != nil {
			return c.fail("dev", exitFailure, fmt.Errorf("error starting the in-memory Kafka broker: %w", err))
		}
		defer cluster.Close()
		e.KafkaBrokers = cluster.ListenAddrs()
		log.WithField("brokers", strings.Join(e.KafkaBrokers, ",")).
			Warn("DEVELOPMENT ONLY: using an in-process, in-memory Kafka-protocol broker (kfake); every record is lost when idemd stops. Set IDEMD_KAFKA_BROKERS to use a real Kafka.")
	}
	fakes, err := startDevFakes(f, c.env, log)
	if err != nil {
		return c.fail("dev", exitFailure, err)
	}
	defer fakes.Close() //nolint:errcheck // in memory: nothing to keep
	if example {
		// The example's tables live in a schema of their own, first on the search_path so
		// that the example SQL names them unqualified.
		appSchema := e.DBSchema + "_dev"
		if err := createDevTables(e.DatabaseURL, appSchema); err != nil {
			return c.fail("dev", exitFailure, err)
		}
		if e.DBSearchPath == "" {
			e.DBSearchPath = devSearchPath(appSchema)
		}
	}
	onReady := func(httpAddr, adminAddr string) {
		printDevBanner(c.stdout, f, example, inMemory, fakes, e, httpAddr, adminAddr, c.env[tokensEnvDev] == "", devToken)
	}
	return c.runDaemon("dev", e, f, onReady)
}

// startDevFakes starts the in-process Pub/Sub and SQS the pipelines need, unless the
// environment points their clients elsewhere, creates the topics, subscriptions and queues
// the pipelines name in them, and points the clients at them (env gets their variables).
func startDevFakes(f *config.File, env environment, log *logrus.Entry) (*brokerenv.Dev, error) {
	res := f.Resources()
	need := brokerenv.DevNeeds{PubSubTopics: res.PubSubTopics, SQSQueues: append(append([]string{}, res.SQSSubscriptions...), res.SQSTargets...)}
	for _, s := range res.PubSubSubscriptions {
		need.PubSubSubscriptions = append(need.PubSubSubscriptions, s.Name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	fakes, err := brokerenv.StartDev(ctx, need, env.lookup)
	if err != nil {
		return nil, err
	}
	for k, v := range fakes.Env {
		env[k] = v
	}
	devFakesRunning.Store(fakes.SQSURL != "")
	if fakes.PubSubAddr != "" {
		log.WithField("pubsub_emulator_host", fakes.PubSubAddr).
			Warn("DEVELOPMENT ONLY: using an in-process, in-memory Pub/Sub (Google's pstest), where each topic the pipelines name has a subscription of the same id; every message is lost when idemd stops. Set PUBSUB_EMULATOR_HOST, or the Google credentials and project, to use another.")
	}
	if fakes.SQSURL != "" {
		log.WithField("sqs_endpoint", fakes.SQSURL).
			Warn("DEVELOPMENT ONLY: using an in-process, in-memory SQS (goaws); every message is lost when idemd stops. Set AWS_ENDPOINT_URL_SQS, or the AWS region and credentials, to use another.")
	}
	return fakes, nil
}

// startDevBroker starts kfake on localhost:9092 when free (so that Kafka tools find it at
// the usual address), else on any port.
func startDevBroker(topics []string) (*kfake.Cluster, error) {
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(3), kfake.ClusterID("idemd-dev")}
	if len(topics) > 0 {
		opts = append(opts, kfake.SeedTopics(3, topics...))
	}
	if ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", kafkaPortDev)); err == nil {
		ln.Close()
		if c, err := kfake.NewCluster(append(opts, kfake.Ports(kafkaPortDev))...); err == nil {
			return c, nil
		}
	}
	return kfake.NewCluster(opts...)
}

// createDevTables runs deploy/idemd.dev.sql in schema.
func createDevTables(url, schema string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("error connecting to the database at %s: %w (start PostgreSQL, or set IDEMD_DATABASE_URL)", databaseLabel(url), err)
	}
	defer conn.Close(ctx)
	quoted := pgx.Identifier{schema}.Sanitize()
	// The advisory lock keeps two dev processes from racing on CREATE IF NOT EXISTS.
	sql := "SELECT pg_advisory_xact_lock(hashtext('idemd.dev:' || $1))"
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("error creating the dev tables: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, sql, schema); err != nil {
		return fmt.Errorf("error creating the dev tables: %w", err)
	}
	if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+quoted+"; SET LOCAL search_path TO "+quoted+";\n"+deploy.DevSQL); err != nil {
		return fmt.Errorf("error creating the dev tables: %w", err)
	}
	return tx.Commit(ctx)
}

// devSearchPath puts dev's schema of example tables first, so that the example SQL finds
// them unqualified.
func devSearchPath(appSchema string) string {
	return pgx.Identifier{appSchema}.Sanitize() + ", public"
}

// devSchemaExists reports whether the database holds dev's example tables' schema
// ({IDEMD_DB_SCHEMA}_dev): the mark of a schema that `idemd dev` ran on.
func devSchemaExists(ctx context.Context, pool *pgxpool.Pool, appSchema string) (bool, error) {
	var ok bool
	err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)", appSchema).Scan(&ok)
	return ok, err
}

// printDevBanner says, loudly, what dev runs and how to try it.
func printDevBanner(w io.Writer, f *config.File, example, inMemory bool, fakes *brokerenv.Dev, e *Env, httpAddr, adminAddr string, showToken bool, devToken string) {
	base := receiverURL(httpAddr, e.TLSCertFile != "")
	var b strings.Builder
	rule := strings.Repeat("=", 78)
	fmt.Fprintln(&b, rule)
	fmt.Fprintln(&b, " idemd dev: DEVELOPMENT ONLY")
	if inMemory {
		fmt.Fprintf(&b, " Kafka: IN-MEMORY broker at %s; all records are lost when idemd stops.\n", strings.Join(e.KafkaBrokers, ","))
	} else {
		fmt.Fprintf(&b, " Kafka: %s\n", strings.Join(e.KafkaBrokers, ","))
	}
	if fakes.PubSubAddr != "" {
		fmt.Fprintf(&b, " Pub/Sub: IN-MEMORY fake (pstest) at %s, project %s; lost when idemd stops.\n", fakes.PubSubAddr, brokerenv.DevProject)
		fmt.Fprintf(&b, "   Its message ids start again from m0 on every start: a subscription without message_id\n"+
			"   (the broker's id) finds the ids of earlier runs already seen in schema %s.\n", e.DBSchema)
		printExports(&b, fakes.Env, "PUBSUB_EMULATOR_HOST", "PUBSUB_PROJECT_ID")
	}
	if fakes.SQSURL != "" {
		fmt.Fprintf(&b, " SQS: IN-MEMORY fake (goaws) at %s; lost when idemd stops.\n", fakes.SQSURL)
		printExports(&b, fakes.Env, "AWS_ENDPOINT_URL_SQS", "AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
	}
	fmt.Fprintf(&b, " PostgreSQL: %s (schema %s)\n", databaseLabel(e.DatabaseURL), e.DBSchema)
	fmt.Fprintf(&b, " Pipelines: %s\n", f.Path)
	if example {
		fmt.Fprintf(&b, " Development secrets are in use for %s and %s unless set.\n", secretEnvDev, tokensEnvDev)
	}
	fmt.Fprintf(&b, " Receiver: %s   Admin: http://%s/metrics /healthz /readyz\n", base, localAddr(adminAddr))
	fmt.Fprintf(&b, " Console:  http://%s/  (admin API: /api/v1, OpenAPI: /openapi/admin.yaml)\n", localAddr(adminAddr))
	if devToken != "" {
		fmt.Fprintf(&b, " Console token for this run (IDEMD_ADMIN_TOKEN was unset): %s\n", devToken)
	} else {
		fmt.Fprintln(&b, " Console token: the value of IDEMD_ADMIN_TOKEN")
	}
	fmt.Fprintln(&b, rule)
	now := time.Now()
	for i, s := range f.Sources {
		if s.Verify.Scheme == "none" && !s.AllowUnverified {
			continue
		}
		line, err := exampleRequest(s, base, nil, "", now.Add(time.Duration(i)*time.Millisecond), example && showToken)
		if err != nil {
			continue
		}
		fmt.Fprintf(&b, "\n# %s (%s): paste twice, the second answer is a replay\n%s\n", s.Name, s.Verify.Scheme, line)
	}
	sign := selfCommand() + " sign"
	if !example {
		sign += " -pipelines " + shellQuote(f.Path)
	}
	if base != signURLDefault {
		sign += " -url " + base
	}
	fmt.Fprintf(&b, "\n# a fresh signed request at any time:\n#   %s -source <name> [-body '<json>']\n", sign)
	if example {
		fmt.Fprintf(&b, "\n# effects (the stripe webhook reaches ledger through Kafka, and gcp_payments then aws_payments through Pub/Sub and SQS):\n#   psql %s -c 'SELECT * FROM %[2]s_dev.payments; SELECT * FROM %[2]s_dev.ledger; SELECT * FROM %[2]s_dev.gcp_payments; SELECT * FROM %[2]s_dev.aws_payments; SELECT * FROM %[2]s_dev.orders'\n",
			psqlTarget(e.DatabaseURL), e.DBSchema)
	}
	fmt.Fprintln(&b)
	_, _ = io.WriteString(w, b.String())
}

// localAddr turns ":8080" into "127.0.0.1:8080" for printing.
func localAddr(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if host == "" || host == "::" || host == "0.0.0.0" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

// selfCommand is how to run this idemd again from a shell, so that the commands dev prints
// work as pasted.
func selfCommand() string {
	exe, err := os.Executable()
	if err != nil {
		return "idemd"
	}
	return selfCommandFor(exe, ".")
}

// selfCommandFor is selfCommand for the binary exe, run from directory dir: "go run" with
// the package when it was started by go run (a temporary binary in a go-build directory),
// "idemd" when it is the binary on PATH, else its path.
func selfCommandFor(exe, dir string) string {
	if strings.Contains(filepath.ToSlash(exe), "/go-build") {
		if _, err := os.Stat(filepath.Join(dir, "cmd", "idemd", "main.go")); err == nil {
			return "go run ./cmd/idemd"
		}
		return "go run github.com/idemd/idemd/cmd/idemd" // from any directory of the module
	}
	if p, err := exec.LookPath("idemd"); err == nil {
		if a, err := os.Stat(p); err == nil {
			if b, err := os.Stat(exe); err == nil && os.SameFile(a, b) {
				return "idemd"
			}
		}
	}
	return shellQuote(exe)
}

// psqlTarget is the argument that connects psql to url: its host, port, user and database
// (databaseLabel), or, when it holds a password (in user info, ?password= or key=value form,
// which dev never prints), the variable it came from.
func psqlTarget(url string) string {
	if cfg, err := pgconn.ParseConfig(url); err != nil || cfg.Password != "" {
		return `"$IDEMD_DATABASE_URL"`
	}
	return shellQuote(databaseLabel(url))
}

// printExports prints the line that points a shell's clients at dev's fakes: the variables
// of names that dev set (those the user set are theirs already).
func printExports(b *strings.Builder, env map[string]string, names ...string) {
	var vars []string
	for _, n := range names {
		if v, ok := env[n]; ok {
			vars = append(vars, n+"="+v)
		}
	}
	if len(vars) > 0 {
		fmt.Fprintf(b, "   clients: export %s\n", strings.Join(vars, " "))
	}
}

package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/idemd/idemd/internal/printable"
)

// Exit codes: 2 for a bad command line or configuration (fix it and run again), 1 for a
// failure while running.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// cli is one invocation: the environment it was given and where it writes.
type cli struct {
	env            environment
	stdout, stderr io.Writer
}

type command struct {
	name    string
	args    string
	summary string
	run     func(c *cli, args []string) int
}

var commands []*command

func init() {
	commands = []*command{
		{"serve", "", "run the roles in IDEMD_ROLES (receiver,consumer,relay,pruner)", (*cli).serve},
		{"dev", "", "one-command local run: migrations, in-memory Kafka broker, example pipelines, example requests", (*cli).dev},
		{"migrate", "", "apply the embedded migrations and exit", (*cli).migrate},
		{"check", "", "validate the configuration and reach every dependency, reporting all problems", (*cli).check},
		{"dlq", "list|replay", "list or replay dead letters", (*cli).dlq},
		{"sign", "", "print a signed example request (curl) for a source", (*cli).sign},
		{"probe", "URL", "GET a health URL, exit 0 on 2xx (for images without curl)", (*cli).probe},
		{"version", "", "print the version", (*cli).version},
	}
}

func run(args []string, environ []string) int {
	c := &cli{env: newEnvironment(environ), stdout: os.Stdout, stderr: os.Stderr}
	return c.main(args)
}

func (c *cli) main(args []string) int {
	if len(args) == 0 {
		c.usage(c.stderr)
		return exitUsage
	}
	name := args[0]
	switch name {
	case "help", "-h", "-help", "--help":
		if len(args) > 1 {
			return c.main([]string{args[1], "--help"})
		}
		c.usage(c.stdout)
		return exitOK
	case "-version", "--version":
		name = "version"
	}
	for _, cmd := range commands {
		if cmd.name == name {
			return cmd.run(c, args[1:])
		}
	}
	fmt.Fprintf(c.stderr, "idemd: unknown command %q\n\n", name)
	c.usage(c.stderr)
	return exitUsage
}

func (c *cli) usage(w io.Writer) {
	fmt.Fprintln(w, "idemd turns at-least-once delivery into exactly-once effects on PostgreSQL.")
	fmt.Fprintln(w, "\nUsage: idemd <command> [flags]\n\nCommands:")
	for _, cmd := range commands {
		fmt.Fprintf(w, "  %-16s %s\n", strings.TrimSpace(cmd.name+" "+cmd.args), cmd.summary)
	}
	fmt.Fprintln(w, "\nRun 'idemd <command> --help' for a command's flags and environment.")
	fmt.Fprintln(w, "Configuration comes from IDEMD_* environment variables and the pipelines file:")
	envHelp(w)
}

// envHelp lists the environment variables with their defaults.
func envHelp(w io.Writer) {
	vars := [][2]string{
		{"IDEMD_DATABASE_URL", "PostgreSQL connection string (required; dev: local server)"},
		{"IDEMD_KAFKA_BROKERS", "comma-separated Kafka brokers (dev: in-memory broker when unset)"},
		{"IDEMD_PIPELINES_FILE", "pipelines file (default idemd.yaml; dev: deploy/idemd.dev.yaml, embedded)"},
		{"IDEMD_HTTP_ADDR", "receiver address (default :8080)"},
		{"IDEMD_HTTP_MAX_CONNS", "receiver connections open at once; more are closed (default 1024)"},
		{"IDEMD_HTTP_MAX_UNVERIFIED_BYTES", "request body bytes read before verification, all requests (default 67108864)"},
		{"IDEMD_ADMIN_ADDR", "/metrics, /healthz, /readyz address (default :9090)"},
		{"IDEMD_LOG_LEVEL", "trace|debug|info|warn|error (default info)"},
		{"IDEMD_LOG_FORMAT", "json|text (default json; dev: text)"},
		{"IDEMD_SHUTDOWN_TIMEOUT", "bound of the drain on SIGTERM (default 30s)"},
		{"IDEMD_DB_SCHEMA", "schema of idemd's tables (default idemd)"},
		{"IDEMD_DB_MAX_CONNS", "connection pool size (default 20)"},
		{"IDEMD_DB_SEARCH_PATH", "search_path of effect SQL (default the server's)"},
		{"IDEMD_ROLES", "roles of serve (default receiver,consumer,relay,pruner)"},
		{"IDEMD_MIGRATE", "apply migrations at start (default true)"},
		{"IDEMD_KAFKA_CREATE_TOPICS", "create the pipelines' topics at start (default false; dev: true)"},
		{"IDEMD_PRUNE_INTERVAL", "pruner period (default 1m)"},
		{"IDEMD_OUTBOX_RETENTION", "how long published outbox rows are kept (default 24h)"},
	}
	for _, v := range vars {
		fmt.Fprintf(w, "  %-26s %s\n", v[0], v[1])
	}
}

// flags returns a FlagSet for a command whose --help prints its summary, flags and, when
// withEnv, the environment.
func (c *cli) flags(name, args, summary string, withEnv bool) *flag.FlagSet {
	fs := flag.NewFlagSet("idemd "+name, flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "Usage: idemd %s [flags] %s\n\n%s\n", name, args, summary)
		hasFlags := false
		fs.VisitAll(func(*flag.Flag) { hasFlags = true })
		if hasFlags {
			fmt.Fprintln(w, "\nFlags:")
			fs.PrintDefaults()
		}
		if withEnv {
			fmt.Fprintln(w, "\nEnvironment:")
			envHelp(w)
		}
	}
	return fs
}

// parse parses args; ok is false when the command should exit with code.
func (c *cli) parse(fs *flag.FlagSet, args []string) (code int, ok bool) {
	fs.SetOutput(c.stderr)
	for _, a := range args {
		if a == "-h" || a == "--help" || a == "-help" {
			fs.SetOutput(c.stdout)
			fs.Usage()
			return exitOK, false
		}
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK, false
		}
		return exitUsage, false
	}
	return 0, true
}

// fail prints err for the user and returns code. Errors may quote what a sender or a file
// wrote: each line is escaped (internal/printable).
func (c *cli) fail(cmd string, code int, err error) int {
	msg := printable.Lines(strings.TrimRight(err.Error(), "\n"))
	fmt.Fprintf(c.stderr, "idemd %s: %s\n", cmd, strings.ReplaceAll(msg, "\n", "\n  "))
	return code
}

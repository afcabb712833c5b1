package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idemd/idemd/internal/brokerenv"
	"github.com/idemd/idemd/internal/printable"
	"github.com/idemd/idemd/internal/tracing"
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

	checkTimeout time.Duration // check's bound on reaching each dependency; 0 is checkTimeoutDefault (tests shorten it)
}

type command struct {
	name    string
	args    string
	summary string
	run     func(c *cli, args []string) int
}

var commands []*command

// label is how the commands list of --help names cmd: its name and arguments.
func (cmd *command) label() string { return strings.TrimSpace(cmd.name + " " + cmd.args) }

func init() {
	commands = []*command{
		{"serve", "", "run the roles in IDEMD_ROLES (receiver,consumer,relay,pruner)", (*cli).serve},
		{"dev", "", "one-command local run: migrations, in-memory Kafka, Pub/Sub and SQS, example pipelines, example requests", (*cli).dev},
		{"migrate", "", "apply the embedded migrations and exit", (*cli).migrate},
		{"check", "", "validate the configuration and reach every dependency, reporting all problems", (*cli).check},
		{"dlq", "list|show|replay", "list, show or replay dead letters (filters, dry run, bulk)", (*cli).dlq},
		{"inspect", "PIPELINE ID", "show a message's whole story: record, effect, outbox, deliveries, conflicts, dead letters", (*cli).inspect},
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
	width := 0
	for _, cmd := range commands {
		width = max(width, len(cmd.label()))
	}
	for _, cmd := range commands {
		fmt.Fprintf(w, "  %-*s  %s\n", width, cmd.label(), cmd.summary)
	}
	fmt.Fprintln(w, "\nRun 'idemd <command> --help' for a command's flags and environment.")
	fmt.Fprintln(w, "Configuration comes from IDEMD_* environment variables and the pipelines file:")
	envHelp(w, "")
	tracingHelp(w, "")
	brokerHelp(w, "")
}

// tracingCommands are the commands that read the OTEL_* variables: those that run the
// daemon, and check.
var tracingCommands = []string{"serve", "dev", "check"}

// tracingHelp lists the OTEL_* variables when command cmd reads them ("" for every
// command).
func tracingHelp(w io.Writer, cmd string) {
	if cmd != "" && !slices.Contains(tracingCommands, cmd) {
		return
	}
	fmt.Fprintln(w, "\nTracing (OpenTelemetry; off unless OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_TRACES_EXPORTER is set):")
	for _, v := range tracing.Variables {
		helpLine(w, v.Name, v.Help, v.Default)
	}
	fmt.Fprintf(w, "  %s\n", tracing.VariablesNote)
}

// brokerCommands are the commands that make Pub/Sub and SQS clients (when the pipelines
// name those brokers).
var brokerCommands = []string{"serve", "dev", "check"}

// brokerHelp lists the variables of the Pub/Sub and SQS clients when command cmd reads them
// ("" for every command).
func brokerHelp(w io.Writer, cmd string) {
	if cmd != "" && !slices.Contains(brokerCommands, cmd) {
		return
	}
	fmt.Fprintln(w, "\nGoogle Cloud Pub/Sub and Amazon SQS (read by their clients when the pipelines name them):")
	for _, v := range brokerenv.Vars {
		helpLine(w, v.Name, v.Help, "")
	}
}

// helpLine prints one variable of a command's help, its help text in a column past the
// longest name.
func helpLine(w io.Writer, name, help, def string) {
	if def != "" {
		help += " (default " + def + ")"
	}
	fmt.Fprintf(w, "  %-*s  %s\n", helpNameWidth(), name, help)
}

// helpNameWidth is the length of the longest variable name that --help lists.
var helpNameWidth = sync.OnceValue(func() int {
	width := 0
	for _, v := range envVars() {
		width = max(width, len(v.Name))
	}
	for _, v := range tracing.Variables {
		width = max(width, len(v.Name))
	}
	for _, v := range brokerenv.Vars {
		width = max(width, len(v.Name))
	}
	return width
})

// envHelp lists the environment variables command cmd reads ("" for all of them), with
// their defaults, from the tags of Env.
func envHelp(w io.Writer, cmd string) {
	for _, v := range envVars() {
		if !v.readBy(cmd) {
			continue
		}
		helpLine(w, v.Name, v.Help, v.Default)
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
			envHelp(w, name)
			tracingHelp(w, strings.Fields(name)[0])
			brokerHelp(w, strings.Fields(name)[0])
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
	// A bad flag prints its error and where the help is, not the whole help: the error
	// would scroll away above it. --help itself prints the whole help (above).
	full := fs.Usage
	fs.Usage = func() { fmt.Fprintf(fs.Output(), "see %s --help\n", fs.Name()) }
	err := fs.Parse(args)
	fs.Usage = full
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK, false
		}
		return exitUsage, false
	}
	return 0, true
}

// noArgs refuses the arguments left after the flags of a command that takes none.
func (c *cli) noArgs(fs *flag.FlagSet) (code int, ok bool) {
	if fs.NArg() == 0 {
		return 0, true
	}
	cmd := strings.TrimPrefix(fs.Name(), "idemd ")
	return c.fail(cmd, exitUsage, fmt.Errorf("unexpected arguments %q (see %s --help)", fs.Args(), fs.Name())), false
}

// fail prints err for the user and returns code. Errors may quote what a sender or a file
// wrote: each line is escaped (internal/printable).
func (c *cli) fail(cmd string, code int, err error) int {
	msg := printable.Lines(strings.TrimRight(err.Error(), "\n"))
	fmt.Fprintf(c.stderr, "idemd %s: %s\n", cmd, strings.ReplaceAll(msg, "\n", "\n  "))
	return code
}

package main

import (
	"fmt"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/config"
	"github.com/idemd/idemd/internal/brokerenv"
	"github.com/idemd/idemd/internal/tracing"
	"github.com/idemd/idemd/receiver"
)

// commandsWithEnv are the commands whose --help has an Environment section.
var commandsWithEnv = []string{"serve", "dev", "migrate", "check", "dlq list", "dlq show", "dlq replay", "inspect", "sign"}

// TestHelpCoversTheEnvironment reads the tags of Env itself: every variable has a help line
// and the commands that read it; `idemd help` lists every variable; each command's --help
// lists exactly the variables it reads; the README's table has a row for each, whose
// default is the variable's (a default changed in one place only fails here).
func TestHelpCoversTheEnvironment(t *testing.T) {
	t.Parallel()
	type variable struct {
		name, def string
		cmds      []string
	}
	var vars []variable
	typ := reflect.TypeFor[Env]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		tag, ok := f.Tag.Lookup("env")
		if !ok {
			continue
		}
		name := "IDEMD_" + strings.Split(tag, ",")[0]
		require.NotEmpty(t, f.Tag.Get("help"), "%s has no help tag", name)
		cmds := strings.Split(f.Tag.Get("cmds"), ",")
		for _, c := range cmds {
			if c != "dlq" { // each of its subcommands
				require.Contains(t, commandsWithEnv, c, "%s: cmds names an unknown command", name)
			}
		}
		vars = append(vars, variable{name, f.Tag.Get("envDefault"), cmds})
	}
	require.GreaterOrEqual(t, len(vars), 19)

	code, out, _ := runIdemd(t, nil, "help")
	require.Equal(t, 0, code)
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	for _, v := range vars {
		require.Regexp(t, `(?m)^  `+v.name+` `, out, "idemd help")
		require.Regexp(t, "(?m)^\\| `"+v.name+"`", string(readme), "README's environment table")
		if v.def != "" {
			require.Regexp(t, "(?m)^\\| `"+v.name+"` \\| `"+regexp.QuoteMeta(v.def)+"`", string(readme),
				"README's environment table: the default of %s", v.name)
		}
	}
	for _, cmd := range commandsWithEnv {
		code, out, _ := runIdemd(t, nil, append(strings.Fields(cmd), "--help")...)
		require.Equal(t, 0, code, cmd)
		_, env, found := strings.Cut(out, "\nEnvironment:\n")
		require.True(t, found, "%s --help has no Environment section", cmd)
		listed := regexp.MustCompile(`(?m)^  (IDEMD_[A-Z_]+) `).FindAllStringSubmatch(env, -1)
		var got []string
		for _, m := range listed {
			got = append(got, m[1])
		}
		var want []string
		for _, v := range vars {
			if slices.Contains(v.cmds, cmd) || slices.Contains(v.cmds, strings.Fields(cmd)[0]) {
				want = append(want, v.name)
			}
		}
		require.Equal(t, want, got, "idemd %s --help lists the variables it reads, only those", cmd)
	}
}

// TestSelfCommand: the commands dev prints run this idemd the way it was started.
func TestSelfCommand(t *testing.T) {
	t.Parallel()
	require.Equal(t, "go run ./cmd/idemd", selfCommandFor("/tmp/go-build123/b001/exe/idemd", "../.."))
	require.Equal(t, "go run github.com/idemd/idemd/cmd/idemd", selfCommandFor("/tmp/go-build123/b001/exe/idemd", t.TempDir()))
	require.Equal(t, `'/opt/my tools/idemd'`, selfCommandFor("/opt/my tools/idemd", "."))
}

// TestReceiverSettings: the defaults of IDEMD_HTTP_MAX_CONNS,
// IDEMD_HTTP_MAX_UNVERIFIED_BYTES, IDEMD_HTTP_MAX_BATCH and IDEMD_HTTP_LINGER (their
// envDefault tags, shown by --help and the README) are the receiver's own; the group commit
// settings reach the daemon's config, IDEMD_HTTP_LINGER=0 as never wait (the receiver's
// negative Linger), not as the receiver's default; bad values are named.
func TestReceiverSettings(t *testing.T) {
	t.Parallel()
	e, err := loadEnv(newEnvironment(nil))
	require.NoError(t, err)
	require.Equal(t, receiver.MaxConnsDefault, e.HTTPMaxConns)
	require.EqualValues(t, receiver.MaxUnverifiedBytesDefault, e.HTTPMaxUnverifiedBytes)
	require.Equal(t, receiver.MaxBatchDefault, e.HTTPMaxBatch)
	require.Equal(t, receiver.LingerDefault, e.HTTPLinger)
	_, err = loadEnv(newEnvironment([]string{"IDEMD_HTTP_MAX_CONNS=0", "IDEMD_HTTP_MAX_UNVERIFIED_BYTES=-1"}))
	require.ErrorContains(t, err, "IDEMD_HTTP_MAX_CONNS: 0 is too small: it must be at least 1")
	require.ErrorContains(t, err, "IDEMD_HTTP_MAX_UNVERIFIED_BYTES: -1 is too small")

	cfg := daemonConfigFrom(e, &config.File{}, nil, logrus.NewEntry(logrus.New()), nil)
	require.Equal(t, receiver.MaxBatchDefault, cfg.HTTPMaxBatch)
	require.Equal(t, receiver.LingerDefault, cfg.HTTPLinger)

	e, err = loadEnv(newEnvironment([]string{"IDEMD_HTTP_MAX_BATCH=1", "IDEMD_HTTP_LINGER=0"}))
	require.NoError(t, err)
	cfg = daemonConfigFrom(e, &config.File{}, nil, logrus.NewEntry(logrus.New()), nil)
	require.Equal(t, 1, cfg.HTTPMaxBatch)
	require.Negative(t, cfg.HTTPLinger, "0 is no linger")
	e, err = loadEnv(newEnvironment([]string{"IDEMD_HTTP_LINGER=3ms"}))
	require.NoError(t, err)
	require.Equal(t, 3*time.Millisecond, daemonConfigFrom(e, &config.File{}, nil, logrus.NewEntry(logrus.New()), nil).HTTPLinger)

	_, err = loadEnv(newEnvironment([]string{"IDEMD_HTTP_MAX_BATCH=0", "IDEMD_HTTP_LINGER=-1ms"}))
	require.ErrorContains(t, err, "IDEMD_HTTP_MAX_BATCH: 0 is too small: it must be at least 1")
	require.ErrorContains(t, err, "IDEMD_HTTP_LINGER: -1ms is negative")
	_, err = loadEnv(newEnvironment([]string{"IDEMD_HTTP_LINGER=soon"}))
	require.ErrorContains(t, err, "IDEMD_HTTP_LINGER")
}

// TestHelpCoversTracingAndBrokers: the commands that read the OTEL_* variables, and those
// that make Pub/Sub and SQS clients (serve, dev, check), list every one of those variables
// in their --help, the others none; `idemd help` lists them all; the README has a row for
// each (its tracing table, its Pub/Sub and SQS table).
func TestHelpCoversTracingAndBrokers(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	var tracingVars, brokerVars []string
	for _, v := range tracing.Variables {
		tracingVars = append(tracingVars, v.Name)
	}
	for _, v := range brokerenv.Vars {
		brokerVars = append(brokerVars, v.Name)
	}
	groups := []struct {
		vars     []string
		commands []string
	}{{tracingVars, tracingCommands}, {brokerVars, brokerCommands}}
	_, out, _ := runIdemd(t, nil, "help")
	for _, g := range groups {
		for _, name := range g.vars {
			require.Regexp(t, `(?m)^  `+name+` `, out, "idemd help")
			require.Regexp(t, "(?m)^\\| `"+name+"`", string(readme), "README's table")
		}
	}
	for _, cmd := range commandsWithEnv {
		args := []string{cmd, "--help"}
		if cmd == "dlq" {
			args = []string{"dlq", "list", "--help"}
		}
		_, out, _ := runIdemd(t, nil, args...)
		for _, g := range groups {
			for _, name := range g.vars {
				if slices.Contains(g.commands, cmd) {
					require.Regexp(t, `(?m)^  `+name+` `, out, "idemd %s --help", cmd)
				} else {
					require.NotContains(t, out, name, "idemd %s --help", cmd)
				}
			}
		}
	}
}

// IDEMD_PROCESSED_PARTITION_INTERVAL: auto (the default) is the longest retention of the
// pipelines; 0 is off; a duration is taken as it is; the rest is refused, named.
func TestPartitionIntervalSetting(t *testing.T) {
	t.Parallel()
	f, err := config.Parse("p.yaml", []byte(`sources:
  - name: stripe
    verify: {scheme: stripe, secrets_env: S}
    retention: 30d
  - name: shop
    verify: {scheme: stripe, secrets_env: S}
    retention: 1d
`), func(string) (string, bool) { return "whsec_0123456789abcdef0123456789", true })
	require.NoError(t, err)
	for value, want := range map[string]time.Duration{"": 30 * 24 * time.Hour, "auto": 30 * 24 * time.Hour, "0": 0, "6h": 6 * time.Hour} {
		environ := environment{}
		if value != "" {
			environ["IDEMD_PROCESSED_PARTITION_INTERVAL"] = value
		}
		e, err := loadEnvFor("check", environ)
		require.NotContains(t, fmt.Sprint(err), "PARTITION", value)
		require.Equal(t, want, e.PartitionInterval.For(f), value)
	}
	e, err := loadEnvFor("check", environment{})
	require.NotContains(t, fmt.Sprint(err), "PARTITION")
	require.Equal(t, 7*24*time.Hour, e.PartitionInterval.For(&config.File{}), "no pipeline: the default retention")
	for value, want := range map[string]string{
		"soon": `IDEMD_PROCESSED_PARTITION_INTERVAL: "soon" is not auto, 0 (off) or a duration (such as 24h or 168h)`,
		"-1h":  `IDEMD_PROCESSED_PARTITION_INTERVAL: must not be negative (auto: the longest retention; 0 turns partitions off), got -1h0m0s`,
	} {
		_, err := loadEnvFor("check", environment{"IDEMD_PROCESSED_PARTITION_INTERVAL": value})
		require.ErrorContains(t, err, want)
	}
}

// One admin token under two names is a configuration error that names the variable (the
// audit could not tell the two actors apart), and never quotes the token.
func TestAdminTokenUnderTwoNames(t *testing.T) {
	t.Parallel()
	const tok = "0123456789abcdef0123"
	_, err := loadEnvFor("serve", environment{"IDEMD_ADMIN_TOKEN": "alice:" + tok + ",bob:" + tok})
	require.ErrorContains(t, err, `IDEMD_ADMIN_TOKEN: entry 2: "bob" has the same token as "alice"`)
	require.NotContains(t, err.Error(), tok)
}

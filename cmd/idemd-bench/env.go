package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idemd/idemd/internal/gctune"
	"github.com/idemd/idemd/internal/pgarray"
	"github.com/idemd/idemd/migrations"
	"github.com/idemd/idemd/processed"
)

const databaseURLDefault = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// effectsDDL is the table the effect SQL writes into, beside idemd's tables. applied_at is
// the applying transaction's now(), the time its claim was made: an id applied twice is a
// duplicate unless the second came at least one retention after the first (repeats).
const effectsDDL = `CREATE TABLE %s.effects (message_id text NOT NULL, payload jsonb, topic text, part int, off bigint,
    applied_at timestamptz NOT NULL DEFAULT now())`

// env is what every section shares: the database schema, the broker, the options.
type env struct {
	o       *options
	logw    io.Writer
	url     string
	pool    *pgxpool.Pool
	schema  string
	brokers []string
	kind    string
	cluster *kfake.Cluster
	runID   string
	// seq numbers the consumer runs (topics and groups).
	seq int
	// claims is idemd's claim store on the bench schema (the growth section's limit with
	// idemd's claim statements).
	claims *processed.Store
}

func newEnv(ctx context.Context, o *options, logw io.Writer) (*env, error) {
	e := &env{o: o, logw: logw}
	var b [4]byte
	_, _ = rand.Read(b[:])
	e.runID = hex.EncodeToString(b[:])
	e.url = o.databaseURL
	if e.url == "" {
		e.url = os.Getenv("IDEMD_DATABASE_URL")
	}
	if e.url == "" {
		e.url = databaseURLDefault
	}
	cfg, err := pgxpool.ParseConfig(e.url)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	cfg.MaxConns = 8
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cfg.AfterConnect = pgarray.AfterConnect
	e.pool, err = pgxpool.NewWithConfig(cctx, cfg)
	if err == nil {
		err = e.pool.Ping(cctx)
	}
	if err != nil {
		return nil, fmt.Errorf("connecting to PostgreSQL: %w", err)
	}
	e.schema = "idemd_bench_" + e.runID
	if err := migrations.Apply(cctx, e.pool, &migrations.Config{Schema: e.schema}); err != nil {
		e.close()
		return nil, fmt.Errorf("migrating schema %s: %w", e.schema, err)
	}
	if _, err := e.pool.Exec(cctx, fmt.Sprintf(effectsDDL, e.q())); err != nil {
		e.close()
		return nil, fmt.Errorf("creating the effects table: %w", err)
	}
	if e.claims, err = processed.New(&processed.Config{Schema: e.schema}); err != nil {
		e.close()
		return nil, err
	}
	brokers := o.brokers
	if brokers == "" {
		brokers = os.Getenv("IDEMD_KAFKA_BROKERS")
	}
	if brokers != "" {
		e.brokers, e.kind = strings.Split(brokers, ","), "external"
	} else {
		e.cluster, err = kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			e.close()
			return nil, fmt.Errorf("starting the in-process broker: %w", err)
		}
		e.brokers, e.kind = e.cluster.ListenAddrs(), "kfake (in-process, in the load generator)"
	}
	return e, nil
}

func (e *env) close() {
	if e.pool != nil && e.schema != "" && !e.o.keepSchema {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if _, err := e.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+e.q()+" CASCADE"); err != nil {
			e.logf("dropping schema %s: %v", e.schema, err)
		}
		cancel()
	}
	if e.pool != nil {
		e.pool.Close()
	}
	if e.cluster != nil {
		e.cluster.Close()
	}
}

// q is the quoted schema.
func (e *env) q() string { return pgx.Identifier{e.schema}.Sanitize() }

func (e *env) logf(format string, args ...any) {
	fmt.Fprintf(e.logw, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
}

// truncate empties every table a section writes to, and leaves processed_messages with
// one epoch, the current one (a prune section with -prune-partition-interval opens epochs):
// emptied, the older ones have expired, and the pruner's own drop removes them.
func (e *env) truncate(ctx context.Context) error {
	q := e.q()
	// No ANALYZE after: with autovacuum off, the statistics of an empty table would hold
	// for the whole section, and a connection whose generic plans were made on them early
	// kept sequential scans of processed_messages however much it grew: idemd's probe of
	// older epochs and its lookups, never the baselines' plain inserts (8.1 M and 18.8 M
	// rows read that way in two runs of -only limit,consumer,receiver; BENCHMARKS.md,
	// phase 27). TRUNCATE leaves the tables unanalyzed, so the planner sizes them by their
	// pages as they grow, as it does between a server's autovacuum ANALYZEs.
	_, err := e.pool.Exec(ctx, "TRUNCATE "+q+".effects, "+q+".processed_messages, "+q+".outbox, "+q+".outbox_published, "+q+".conflicts, "+q+".dead_letters")
	if err == nil {
		_, err = e.claims.DropExpiredEpochs(ctx, e.pool)
	}
	return err
}

func (e *env) count(ctx context.Context, from string) (int, error) {
	var n int
	err := e.pool.QueryRow(ctx, "SELECT count(*) FROM "+strings.ReplaceAll(from, "{schema}", e.q())).Scan(&n)
	return n, err
}

// topic creates a topic unique to this run and waits until its metadata is visible.
func (e *env) topic(ctx context.Context, name string, partitions int) (string, error) {
	topic := "bench." + e.runID + "." + name
	cl := &kafka.Client{Addr: kafka.TCP(e.brokers...), Timeout: 30 * time.Second}
	resp, err := cl.CreateTopics(ctx, &kafka.CreateTopicsRequest{
		Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}},
	})
	if err != nil {
		return "", fmt.Errorf("creating topic %s: %w", topic, err)
	}
	if err := resp.Errors[topic]; err != nil {
		return "", fmt.Errorf("creating topic %s: %w", topic, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		md, err := cl.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
		if err == nil && len(md.Topics) == 1 && md.Topics[0].Error == nil && len(md.Topics[0].Partitions) == partitions {
			return topic, nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("topic %s did not appear: %v", topic, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Machine describes where the run happened.
type Machine struct {
	CPUs              int    `json:"cpus"`
	GOMAXPROCS        int    `json:"gomaxprocs"`
	MemoryMB          int    `json:"memory_mb"`
	GoVersion         string `json:"go_version"`
	PostgreSQL        string `json:"postgresql"`
	Fsync             string `json:"fsync"`
	SynchronousCommit string `json:"synchronous_commit"`
	Broker            string `json:"broker"`
	Started           string `json:"started"`
	SharedBuffers     string `json:"shared_buffers"`
	Autovacuum        string `json:"autovacuum"`
	LoadAvg           string `json:"load_average"`
	// ChildGC is the children's collector setting: the daemon's default (gctune) or the
	// GOGC and GOMEMLIMIT of the environment or of -child-env.
	ChildGC string `json:"child_gc"`
}

func (e *env) machine(ctx context.Context) Machine {
	m := Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), Broker: e.kind, Started: time.Now().UTC().Format(time.RFC3339)}
	_ = e.pool.QueryRow(ctx, "SHOW server_version").Scan(&m.PostgreSQL)
	_ = e.pool.QueryRow(ctx, "SHOW fsync").Scan(&m.Fsync)
	_ = e.pool.QueryRow(ctx, "SHOW synchronous_commit").Scan(&m.SynchronousCommit)
	_ = e.pool.QueryRow(ctx, "SHOW shared_buffers").Scan(&m.SharedBuffers)
	_ = e.pool.QueryRow(ctx, "SHOW autovacuum").Scan(&m.Autovacuum)
	m.ChildGC = e.childGC()
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) >= 3 {
			m.LoadAvg = strings.Join(f[:3], " ")
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
				kb, _ := strconv.Atoi(f[1])
				m.MemoryMB = kb / 1024
			}
		}
	}
	return m
}

// childGC describes the collector setting the children run with.
func (e *env) childGC() string {
	env := map[string]string{}
	for _, name := range []string{"GOGC", "GOMEMLIMIT"} {
		if v, ok := os.LookupEnv(name); ok {
			env[name] = v
		}
	}
	if e.o.childEnv != "" {
		for _, kv := range strings.Split(e.o.childEnv, ",") {
			if name, v, _ := strings.Cut(kv, "="); name == "GOGC" || name == "GOMEMLIMIT" {
				env[name] = v
			}
		}
	}
	var parts []string
	if v, ok := env["GOGC"]; ok {
		parts = append(parts, "GOGC="+v)
	} else {
		parts = append(parts, fmt.Sprintf("GOGC=%d (the daemon's default)", gctune.Percent))
	}
	if v, ok := env["GOMEMLIMIT"]; ok {
		parts = append(parts, "GOMEMLIMIT="+v)
	}
	return strings.Join(parts, ", ")
}

// child is a running idemd side of a load: this binary with -serve.
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines *bufio.Scanner
	// Ready is the rest of the child's "ready" line (the receiver's address).
	Ready   string
	done    chan error
	stopped bool
	cpu     *cpuStart
}

// startChild starts the idemd side of a load and waits until it says it is ready.
func (e *env) startChild(ctx context.Context, kind string, cfg childConfig) (*child, error) {
	cfg.URL, cfg.Schema, cfg.Brokers = e.url, e.schema, e.brokers
	cfg.AppName = "idemd-bench-" + e.runID + "-" + kind
	cfg.KeepPublished = e.o.keepPublished
	cfg.NoHandoff = e.o.noHandoff
	cfg.NoFilter = e.o.noFilter
	cfg.RelayPool = e.o.relayPool
	if e.o.profileDir != "" {
		cfg.ProfileDir = e.o.profileDir
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "--serve="+kind, "--serve-config="+string(b))
	if e.o.childEnv != "" {
		cmd.Env = append(os.Environ(), strings.Split(e.o.childEnv, ",")...)
	}
	c, err := e.startProcess(ctx, kind, cmd)
	if err != nil {
		return nil, err
	}
	e.startCPU(ctx, c, cfg.AppName)
	return c, nil
}

// startProcess starts cmd, a child that prints "ready [detail]" on its standard output once
// the load may start and stops when its standard input closes, and waits until it is ready.
func (e *env) startProcess(ctx context.Context, kind string, cmd *exec.Cmd) (*child, error) {
	cmd.Stderr = e.logw
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the %s child: %w", kind, err)
	}
	c := &child{cmd: cmd, stdin: stdin, lines: bufio.NewScanner(stdout), done: make(chan error, 1)}
	ready := make(chan error, 1)
	go func() {
		if c.lines.Scan() {
			line := c.lines.Text()
			if rest, ok := strings.CutPrefix(line, "ready"); ok {
				c.Ready = strings.TrimSpace(rest)
				ready <- nil
			} else {
				ready <- fmt.Errorf("unexpected line from the %s child: %q", kind, line)
			}
		} else {
			ready <- fmt.Errorf("the %s child exited before it was ready", kind)
		}
		for c.lines.Scan() {
		}
		c.done <- cmd.Wait()
	}()
	select {
	case err := <-ready:
		if err != nil {
			_ = cmd.Process.Kill()
			return nil, err
		}
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		return nil, ctx.Err()
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("the %s child was not ready within 60 s", kind)
	}
	return c, nil
}

// peakRSS returns the child's VmHWM in MiB.
func (c *child) peakRSS() (float64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(c.cmd.Process.Pid) + "/status")
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, err := strconv.Atoi(f[1])
			return float64(kb) / 1024, err
		}
	}
	return 0, errors.New("no VmHWM in /proc status")
}

// stop reads the child's peak RSS, then asks it to drain and exit (stdin closed).
func (c *child) stop() (float64, error) {
	rss, rssErr := c.peakRSS()
	c.stopped = true
	_ = c.stdin.Close()
	select {
	case err := <-c.done:
		if err != nil {
			return rss, fmt.Errorf("child: %w", err)
		}
	case <-time.After(60 * time.Second):
		_ = c.cmd.Process.Kill()
		return rss, errors.New("child did not stop within 60 s")
	}
	return rss, rssErr
}

// kill ends a child that is no longer needed after a failure.
func (c *child) kill() {
	if c != nil && !c.stopped {
		c.stopped = true
		_ = c.stdin.Close()
		select {
		case <-c.done:
		case <-time.After(15 * time.Second):
			_ = c.cmd.Process.Kill()
		}
	}
}

// checkpoints returns how many checkpoints the server has completed (pg_stat_bgwriter,
// PostgreSQL 16 and older; -1 where it cannot tell), so that a latency run can say how
// many fell inside it.
func (e *env) checkpoints(ctx context.Context) int64 {
	var n int64
	if err := e.pool.QueryRow(ctx, `SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter`).Scan(&n); err != nil {
		return -1
	}
	return n
}

// checkpointWrites returns how many buffers checkpoints have written (pg_stat_bgwriter,
// PostgreSQL 16 and older; -1 where it cannot tell): a checkpoint spreads its writes over
// minutes, so a short run can fall inside one that completes after it.
func (e *env) checkpointWrites(ctx context.Context) int64 {
	var n int64
	if err := e.pool.QueryRow(ctx, `SELECT buffers_checkpoint FROM pg_stat_bgwriter`).Scan(&n); err != nil {
		return -1
	}
	return n
}

// latencyNote says how many checkpoints completed since the count before (checkpoints).
func (e *env) latencyNote(ctx context.Context, before int64) string {
	after := e.checkpoints(ctx)
	if before < 0 || after < 0 {
		return "checkpoints during the run unknown"
	}
	if n := after - before; n != 1 {
		return fmt.Sprintf("%d checkpoints completed during the run", n)
	}
	return "1 checkpoint completed during the run"
}

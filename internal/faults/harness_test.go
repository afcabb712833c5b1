package faults

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/internal/proctest"
)

// long reports whether the long sizes were asked for (IDEMD_FAULTS=long, `make faults`).
func long() bool { return os.Getenv("IDEMD_FAULTS") == "long" }

// size picks the short or the long figure.
func size(short, long_ int) int {
	if long() {
		return long_
	}
	return short
}

func TestMain(m *testing.M) { proctest.Main(m) }

// proc is one running idemd process.
type proc = proctest.Proc

// stopTimeout is how long a process may drain after SIGTERM.
const stopTimeout = 60 * time.Second

// node is the configuration of one idemd process, started (and restarted) on the same
// addresses and connection name.
type node struct {
	t         *testing.T
	name      string // also the PostgreSQL application_name of its connections
	httpAddr  string
	adminAddr string
	vars      map[string]string
	// runs keeps every run of this node, for the secret scan of their stderr.
	runs []*proc
	cur  *proc
	mu   sync.Mutex
}

// newNode prepares a node on schema with pipelines file and roles; extra overrides vars.
func newNode(t *testing.T, schema, pipelines, roles string, brokers []string, extra map[string]string) *node {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	n := &node{t: t, name: "idemd-faults-" + hex.EncodeToString(b[:]), httpAddr: proctest.FreeAddr(t), adminAddr: proctest.FreeAddr(t)}
	n.vars = map[string]string{
		"IDEMD_DATABASE_URL":     withAppName(pgtest.URL(), n.name),
		"IDEMD_PIPELINES_FILE":   pipelines,
		"IDEMD_DB_SCHEMA":        schema,
		"IDEMD_DB_MAX_CONNS":     "6",
		"IDEMD_DB_SEARCH_PATH":   schema + ",public",
		"IDEMD_HTTP_ADDR":        n.httpAddr,
		"IDEMD_ADMIN_ADDR":       n.adminAddr,
		"IDEMD_ROLES":            roles,
		"IDEMD_SHUTDOWN_TIMEOUT": "20s",
		"IDEMD_LOG_LEVEL":        "info",
		"IDEMD_PRUNE_INTERVAL":   "1h",
	}
	if len(brokers) > 0 {
		n.vars["IDEMD_KAFKA_BROKERS"] = strings.Join(brokers, ",")
	}
	for k, v := range extra {
		n.vars[k] = v
	}
	t.Cleanup(func() {
		n.mu.Lock()
		p := n.cur
		n.mu.Unlock()
		// proctest killed a run still going before this cleanup (registered later, runs first).
		if t.Failed() && p != nil {
			out := p.Stderr()
			if len(out) > 8000 {
				out = "…" + out[len(out)-8000:]
			}
			t.Logf("%s stderr (last run):\n%s", n.name, out)
		}
	})
	return n
}

// withAppName adds application_name to a connection URL: the PostgreSQL outage test
// terminates exactly the backends of one process by that name.
func withAppName(u, name string) string {
	pu, err := url.Parse(u)
	if err != nil {
		panic(err)
	}
	q := pu.Query()
	q.Set("application_name", name)
	pu.RawQuery = q.Encode()
	return pu.String()
}

// start runs the node (again) and returns at once.
func (n *node) start() *proc {
	n.t.Helper()
	p := proctest.Start(n.t, n.vars, "serve")
	n.mu.Lock()
	n.cur = p
	n.runs = append(n.runs, p)
	n.mu.Unlock()
	return p
}

// startReady runs the node and waits until /readyz answers 200.
func (n *node) startReady() *proc {
	n.t.Helper()
	p := n.start()
	n.waitReady(p)
	return p
}

// waitReady polls /readyz: a subprocess gives no other signal.
func (n *node) waitReady(p *proc) {
	n.t.Helper()
	if err := p.WaitReady(n.adminAddr, 60*time.Second); err != nil {
		n.t.Fatalf("%s %v:\n%s", n.name, err, p.Stderr())
	}
}

// allLogs is the stderr of every run of the node.
func (n *node) allLogs() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var sb strings.Builder
	for _, p := range n.runs {
		sb.WriteString(p.Stderr())
	}
	return sb.String()
}

// db is one test's schema: idemd's tables (migrated by the first process) and the effect
// tables the test creates beside them.
type db struct {
	pool   *pgxpool.Pool
	schema string
}

// newDB creates the schema with the effect tables of ddl ({s} is the schema), dropped at
// cleanup.
func newDB(t *testing.T, ddl string) *db {
	t.Helper()
	d := &db{pool: pgtest.Pool(t, 3), schema: pgtest.SchemaName(t)}
	ctx := context.Background()
	_, err := d.pool.Exec(ctx, "CREATE SCHEMA "+d.schema+";\n"+strings.ReplaceAll(ddl, "{s}", d.schema))
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = d.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{d.schema}.Sanitize()+" CASCADE")
	})
	return d
}

// count is SELECT count(*) FROM schema.<from>; 0 while the table does not exist yet.
// outboxRows counts every outbox row, still to publish or published and kept
// (IDEMD_OUTBOX_KEEP_PUBLISHED moves them to outbox_published), in one snapshot.
func (d *db) outboxRows(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, d.pool.QueryRow(context.Background(),
		"SELECT (SELECT count(*) FROM "+d.schema+".outbox) + (SELECT count(*) FROM "+d.schema+".outbox_published)").Scan(&n))
	return n
}

func (d *db) count(t *testing.T, from string) int {
	t.Helper()
	var n int
	err := d.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+d.schema+"."+from).Scan(&n)
	if err != nil && strings.Contains(err.Error(), "42P01") {
		return 0
	}
	require.NoError(t, err)
	return n
}

// int runs a query returning one integer.
func (d *db) int(t *testing.T, sql string) int {
	t.Helper()
	var n int
	require.NoError(t, d.pool.QueryRow(context.Background(), strings.ReplaceAll(sql, "{s}", d.schema)).Scan(&n))
	return n
}

// watch returns a watcher of the schema's tables (names relative to it: "effects",
// "outbox"): the effects happen in idemd processes, and their commits are the signal.
// idemd's own tables exist once a process has migrated the schema.
func (d *db) watch(t *testing.T, tables ...string) *pgtest.Watcher {
	t.Helper()
	qualified := make([]string, len(tables))
	for i, table := range tables {
		qualified[i] = d.schema + "." + table
	}
	return pgtest.Watch(t, qualified...)
}

// until waits until cond holds, checking it again after each commit to the tables w
// watches; it fails the test when timeout passes first, or when p (if not nil) exits.
func until(t *testing.T, w *pgtest.Watcher, p *proc, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if p != nil {
		go func() {
			select {
			case <-p.Done():
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	if err := w.Wait(ctx, cond); err != nil {
		if p != nil && p.Exited() {
			t.Fatalf("idemd exited (%v) while the test waited for %s", p.Err(), what)
		}
		t.Fatalf("timed out after %s waiting for %s: %v", timeout, what, err)
	}
}

// tally counts what the test's own goroutines did (ids answered 2xx) and wakes a test
// waiting for a count: no polling.
type tally struct {
	mu      sync.Mutex
	n       int64
	changed chan struct{} // closed (and replaced) by each Add
}

// Add adds d to the count.
func (c *tally) Add(d int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n += d
	if c.changed != nil {
		close(c.changed)
		c.changed = nil
	}
}

// Load returns the count.
func (c *tally) Load() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// waitFor waits until the count reaches n, or fails the test after timeout.
func (c *tally) waitFor(t *testing.T, timeout time.Duration, what string, n int64) {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		c.mu.Lock()
		if c.n >= n {
			c.mu.Unlock()
			return
		}
		if c.changed == nil {
			c.changed = make(chan struct{})
		}
		changed := c.changed
		c.mu.Unlock()
		select {
		case <-changed:
		case <-timer.C:
			t.Fatalf("timed out after %s waiting for %s (%d of %d)", timeout, what, c.Load(), n)
		}
	}
}

// writeFile writes a pipelines file into the test's temporary directory.
func writeFile(t *testing.T, content string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "idemd.yaml")
	require.NoError(t, os.WriteFile(f, []byte(content), 0o600))
	return f
}

// --- Kafka --------------------------------------------------------------------------------

// Group timings the fault suite gives every consumer: idemd's defaults (30 s session and
// rebalance timeouts) would stall each crash for half a minute while the group waits for
// the dead member. The broker rewrites JoinGroup requests (test-only) instead of idemd
// growing an option.
const (
	groupSessionTimeout   = 6 * time.Second
	groupRebalanceTimeout = 6 * time.Second
)

// newBroker starts an in-process Kafka-protocol broker (kfake) for one test, closed at
// cleanup. opts may fix its port.
func newBroker(t *testing.T, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)...)
	require.NoError(t, err)
	c.ControlKey(int16(kmsg.JoinGroup), func(r kmsg.Request) (kmsg.Response, error, bool) {
		if jg, ok := r.(*kmsg.JoinGroupRequest); ok {
			jg.SessionTimeoutMillis = int32(groupSessionTimeout / time.Millisecond)
			jg.RebalanceTimeoutMillis = int32(groupRebalanceTimeout / time.Millisecond)
		}
		return nil, nil, false // observed and changed; the broker handles it
	})
	t.Cleanup(c.Close)
	return c
}

// produce writes msgs to topic (hash-partitioned by key), waiting for every ack.
func produce(t *testing.T, brokers []string, topic string, msgs []kafka.Message) {
	t.Helper()
	w := &kafka.Writer{
		Addr: kafka.TCP(brokers...), Topic: topic, Balancer: &kafka.Hash{},
		BatchSize: 1000, BatchTimeout: 5 * time.Millisecond, RequiredAcks: kafka.RequireAll,
	}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i := 0; i < len(msgs); i += 5000 {
		require.NoError(t, w.WriteMessages(ctx, msgs[i:min(i+5000, len(msgs))]...))
	}
}

// --- HTTP -------------------------------------------------------------------------------

// stripeSign returns a Stripe-Signature header value for body at ts.
func stripeSign(secret string, ts int64, body []byte) string {
	t := strconv.FormatInt(ts, 10)
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(t + "." + string(body)))
	return "t=" + t + ",v1=" + hex.EncodeToString(mac.Sum(nil))
}

// stripeRequest is a webhook signed the way Stripe signs it.
func stripeRequest(t *testing.T, u, secret string, body []byte) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, u, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Stripe-Signature", stripeSign(secret, time.Now().Unix(), body))
	return req
}

// retryUntil2xx sends the request built by mk until it gets a 2xx, the way a webhook
// sender does: each attempt is the same delivery (same id, same body). It returns the
// number of attempts and the statuses seen, or fails after the deadline.
func retryUntil2xx(ctx context.Context, client *http.Client, mk func() *http.Request) (attempts int, statuses map[int]int, err error) {
	statuses = map[int]int{}
	for wait := 10 * time.Millisecond; ; wait = min(wait*2, 250*time.Millisecond) {
		attempts++
		resp, err := client.Do(mk().WithContext(ctx))
		if err == nil {
			resp.Body.Close()
			statuses[resp.StatusCode]++
			if resp.StatusCode/100 == 2 {
				return attempts, statuses, nil
			}
			if resp.StatusCode != http.StatusServiceUnavailable && resp.StatusCode != http.StatusConflict {
				return attempts, statuses, fmt.Errorf("status %d is not retryable", resp.StatusCode)
			}
		} else {
			statuses[0]++
		}
		select {
		case <-ctx.Done():
			return attempts, statuses, fmt.Errorf("no 2xx before the deadline (last error %v)", err)
		case <-time.After(wait):
		}
	}
}

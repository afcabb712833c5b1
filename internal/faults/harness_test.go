package faults

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemd/idemd/internal/pgtest"
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

var (
	buildOnce sync.Once
	binary    string
	buildErr  error
)

// idemdBinary builds cmd/idemd once per test binary, into a temporary directory.
func idemdBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "idemd-faults-")
		if err != nil {
			buildErr = err
			return
		}
		binary = filepath.Join(dir, "idemd")
		out, err := exec.Command("go", "build", "-o", binary, "github.com/idemd/idemd/cmd/idemd").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	require.NoError(t, buildErr)
	return binary
}

// syncBuffer is a bytes.Buffer safe for a writer and readers at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// proc is one running idemd process.
type proc struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	done   chan struct{}
	err    error
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill sends SIGKILL: no drain, no offset commit, no relay flush.
func (p *proc) kill(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("idemd did not die of SIGKILL")
	}
}

// stop sends SIGTERM and waits for the drain.
func (p *proc) stop(t *testing.T) int {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("idemd did not exit after SIGTERM")
	}
	return p.cmd.ProcessState.ExitCode()
}

// node is the configuration of one idemd process, started (and restarted) on the same
// addresses and connection name.
type node struct {
	t         *testing.T
	name      string // also the PostgreSQL application_name of its connections
	httpAddr  string
	adminAddr string
	vars      map[string]string
	// logs keeps the stderr of every run of this node, for the secret scan.
	logs []*syncBuffer
	cur  *proc
	mu   sync.Mutex
}

// newNode prepares a node on schema with pipelines file and roles; extra overrides vars.
func newNode(t *testing.T, schema, pipelines, roles string, brokers []string, extra map[string]string) *node {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	n := &node{t: t, name: "idemd-faults-" + hex.EncodeToString(b[:]), httpAddr: freeAddr(t), adminAddr: freeAddr(t)}
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
		if p != nil && !p.exited() {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() && p != nil {
			out := p.stderr.String()
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
	cmd := exec.Command(idemdBinary(n.t), "serve")
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for k, v := range n.vars {
		env = append(env, k+"="+v)
	}
	cmd.Env = env
	p := &proc{cmd: cmd, stderr: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stderr = p.stderr
	require.NoError(n.t, cmd.Start())
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	n.mu.Lock()
	n.cur = p
	n.logs = append(n.logs, p.stderr)
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
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if p.exited() {
			n.t.Fatalf("%s exited before it was ready (%v):\n%s", n.name, p.err, p.stderr.String())
		}
		resp, err := http.Get("http://" + n.adminAddr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(25 * time.Millisecond)
	}
	n.t.Fatalf("%s did not become ready", n.name)
}

// allLogs is the stderr of every run of the node.
func (n *node) allLogs() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var sb strings.Builder
	for _, l := range n.logs {
		sb.WriteString(l.String())
	}
	return sb.String()
}

// freeAddr returns a loopback address with a port free right now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
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

// waitFor polls cond every 20 ms until it holds or timeout passes: the effects happen in
// other processes, so polling the database is the only signal.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
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

// createTopic creates topic with partitions and waits for its metadata.
func createTopic(t *testing.T, brokers []string, topic string, partitions int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	// Retried: after a broker came back, the shared transport's pooled connections to the
	// old one fail once.
	for {
		resp, err := cl.CreateTopics(ctx, &kafka.CreateTopicsRequest{
			Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}},
		})
		if err == nil {
			require.NoError(t, resp.Errors[topic])
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("creating topic %s: %v", topic, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	for {
		md, err := cl.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
		if err == nil && len(md.Topics) == 1 && md.Topics[0].Error == nil && len(md.Topics[0].Partitions) == partitions {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("topic %s did not appear: %v", topic, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
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

// readAll reads topic from the beginning of every partition until it has want records or
// nothing arrived for quiet (after want was reached or the deadline passed).
func readAll(t *testing.T, brokers []string, topic string, want int, timeout time.Duration) []kafka.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	md, err := cl.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	require.NoError(t, err)
	require.Len(t, md.Topics, 1)
	var (
		mu  sync.Mutex
		out []kafka.Message
		wg  sync.WaitGroup
	)
	for _, p := range md.Topics[0].Partitions {
		wg.Add(1)
		go func(partition int) {
			defer wg.Done()
			r := kafka.NewReader(kafka.ReaderConfig{
				Brokers: brokers, Topic: topic, Partition: partition,
				MinBytes: 1, MaxBytes: 10 << 20, MaxWait: 50 * time.Millisecond,
			})
			defer r.Close()
			for {
				mu.Lock()
				done := len(out) >= want
				mu.Unlock()
				if done {
					// Keep reading briefly: extra copies (republished records) count too.
					fctx, fcancel := context.WithTimeout(ctx, 300*time.Millisecond)
					m, err := r.ReadMessage(fctx)
					fcancel()
					if err != nil {
						return
					}
					mu.Lock()
					out = append(out, m)
					mu.Unlock()
					continue
				}
				fctx, fcancel := context.WithTimeout(ctx, 200*time.Millisecond)
				m, err := r.ReadMessage(fctx)
				fcancel()
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					continue
				}
				mu.Lock()
				out = append(out, m)
				mu.Unlock()
			}
		}(p.ID)
	}
	wg.Wait()
	return out
}

// header returns the value of the record header named key.
func header(m kafka.Message, key string) string {
	for _, h := range m.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
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

package faults

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idemd/idemd/internal/kafkatest"
	"github.com/idemd/idemd/internal/outageproxy"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/internal/proctest"
)

// outageDDL: the webhook source's effect table and the subscription's.
const outageDDL = effectsDDL + `;
CREATE TABLE {s}.ledger (message_id text NOT NULL, applied_by text NOT NULL)`

// terminate ends every backend of the named application once; it returns how many.
func terminate(t *testing.T, d *db, app string) int {
	var n int
	err := d.pool.QueryRow(context.Background(),
		"SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&n)
	if err != nil {
		t.Logf("terminate: %v", err)
	}
	return n
}

// TestPostgresOutage: webhooks flow in (receiver → effect and outbox → relay → topic →
// consumer → ledger) while every PostgreSQL backend of the idemd process is terminated,
// once in a while and then without pause for longer than the receiver's apply timeout.
// The receiver answers 503 with Retry-After during the outage, the process recovers without
// a restart, and in the end every webhook has exactly one effect and one ledger row.
// The shared PostgreSQL server is never restarted: only this process's backends, found by
// its application_name, are terminated, and the outage is a TCP proxy between the process
// and the server that closes and refuses connections.
func TestPostgresOutage(t *testing.T) {
	t.Parallel()
	n, outages := size(1500, 10000), size(1, 3)
	broker := newBroker(t)
	brokers := broker.ListenAddrs()
	d := newDB(t, outageDDL)
	mid := "mid-" + d.schema
	kafkatest.CreateTopicOn(t, brokers, mid, 6)
	file := writeFile(t, fmt.Sprintf(`sources:
  - name: stripe
    verify: {scheme: stripe, secrets_env: [FAULTS_STRIPE_SECRET]}
    effect:
      sql: "INSERT INTO %[1]s.effects (message_id, applied_by) VALUES (@message_id, current_setting('application_name'))"
    publish: {topic: %[2]s, key: {json: /id}}
subscriptions:
  - name: ledger
    topics: [%[2]s]
    group: g-%[1]s
    effect: {sql: "INSERT INTO %[1]s.ledger (message_id, applied_by) VALUES (@message_id, current_setting('application_name'))"}
`, d.schema, mid))
	nd := newNode(t, d.schema, file, "receiver,consumer,relay", brokers, map[string]string{"FAULTS_STRIPE_SECRET": faultsStripeSecret})
	pu, err := url.Parse(pgtest.URL())
	require.NoError(t, err)
	proxy := outageproxy.New(t, pu.Host)
	pu.Host = proxy.Addr()
	nd.vars["IDEMD_DATABASE_URL"] = withAppName(pu.String(), nd.name)
	p := nd.startReady()
	w := d.watch(t, "ledger", "outbox")

	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("evt_pg_%06d", i)
	}
	// The last id of each outage is its probe (below); the senders deliver the others.
	probes := ids[n-outages:]
	hook := "http://" + nd.httpAddr + "/webhooks/stripe"
	var (
		done                 tally
		unavailable, withRA  atomic.Int64
		inOutage             atomic.Bool
		duringOutage503      atomic.Int64
		probe503             atomic.Int64
		mu                   sync.Mutex
		badRetryAfter        []string
		terminated, cutTotal int
	)
	onStatus := func(r *http.Response) {
		if r.StatusCode != http.StatusServiceUnavailable {
			return
		}
		unavailable.Add(1)
		if inOutage.Load() {
			duringOutage503.Add(1)
		}
		if ra := r.Header.Get("Retry-After"); ra != "" {
			if s, err := strconv.Atoi(ra); err == nil && s > 0 {
				withRA.Add(1)
				return
			}
			mu.Lock()
			badRetryAfter = append(badRetryAfter, ra)
			mu.Unlock()
		}
	}
	probeClient := &http.Client{Timeout: time.Minute, Transport: observe{http.DefaultTransport, onStatus}}
	start := time.Now()
	res := make(chan map[int]int, 1)
	go func() {
		// Few senders: the load spreads over the outages instead of finishing before them.
		_, st := deliverAll(t, hook, ids[:n-outages], 4, 5, &done, onStatus)
		res <- st
	}()
	for o := range outages {
		at := int64(n * (o + 1) / (outages + 2))
		done.waitFor(t, 3*time.Minute, "load before the outage", at)
		// Short cuts first: a connection lost now and then.
		for range 5 {
			terminated += terminate(t, d, nd.name)
			time.Sleep(100 * time.Millisecond)
		}
		// Then an outage longer than the receiver's apply timeout (5 s): the database is
		// unreachable (the proxy refuses connections) and every backend that still
		// exists is terminated.
		inOutage.Store(true)
		proxy.SetDown(true)
		// A webhook sent as the outage begins is answered 503 as soon as its batch finds
		// that no connection can be opened (the receiver does not retry an unreachable
		// database). The senders' requests may be answered after the outage ends: a
		// COMMIT cut without an answer waits up to 10 s for its outcome.
		probeReq := stripeRequest(t, hook, faultsStripeSecret, webhookBody(probes[o]))
		probed := make(chan struct{})
		go func() {
			defer close(probed)
			resp, err := probeClient.Do(probeReq)
			if err == nil {
				_ = resp.Body.Close()
				if resp.StatusCode == http.StatusServiceUnavailable {
					probe503.Add(1)
				}
			}
		}()
		end := time.Now().Add(7 * time.Second)
		for time.Now().Before(end) {
			cutTotal += terminate(t, d, nd.name)
			time.Sleep(50 * time.Millisecond)
		}
		proxy.SetDown(false)
		inOutage.Store(false)
		<-probed
		require.False(t, p.Exited(), "idemd survives the outage without a restart (%v)", p.Err())
	}
	statuses := <-res
	// Then each probe is delivered as its sender would, until the receiver takes it.
	pctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, id := range probes {
		_, _, err := retryUntil2xx(pctx, probeClient, func() *http.Request {
			return stripeRequest(t, hook, faultsStripeSecret, webhookBody(id))
		})
		require.NoError(t, err, "probe %s after the outage", id)
	}
	until(t, w, p, 3*time.Minute, "every ledger row and every outbox row published", func() bool {
		return d.count(t, "ledger") >= n && d.count(t, "outbox WHERE published_at IS NULL") == 0
	})
	require.False(t, p.Exited(), "idemd was never restarted")
	nd.waitReady(p)
	rows, _ := checkEffects(t, d, n)
	require.Equal(t, n, d.int(t, "SELECT count(DISTINCT message_id) FROM {s}.ledger"), "the consumer resumed: every id reached the ledger")
	require.Equal(t, n, d.count(t, "ledger"), "no id reached the ledger twice")
	require.Equal(t, int64(outages), probe503.Load(), "a webhook sent as each outage began was answered 503")
	require.Empty(t, badRetryAfter, "every 503 carries Retry-After in seconds")
	require.Equal(t, unavailable.Load(), withRA.Load(), "every 503 carries Retry-After")
	require.Equal(t, 0, p.Stop(t, stopTimeout))
	t.Logf("FIGURES postgres-outage: ids=%d outages=%d(7s each) cut_rounds=%d backends_terminated=%d 503_with_retry_after=%d 503_during_outage=%d statuses=%v effects=%d ledger=%d lost=0 duplicated=0 restarts=0 took=%s",
		n, outages, 5*outages, cutTotal+terminated, withRA.Load(), duringOutage503.Load(), statuses, rows, d.count(t, "ledger"), time.Since(start).Round(time.Second))
}

// restartable is a kfake cluster on a fixed port that a test can take away and bring
// back (empty: kfake keeps records in memory).
type restartable struct {
	t    *testing.T
	port int
	mu   sync.Mutex
	c    *kfake.Cluster
}

func newRestartable(t *testing.T) *restartable {
	t.Helper()
	addr := proctest.FreeAddr(t)
	_, ps, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(ps)
	r := &restartable{t: t, port: port}
	r.up()
	t.Cleanup(r.down)
	return r
}

func (r *restartable) up() {
	r.mu.Lock()
	defer r.mu.Unlock()
	var err error
	for range 50 { // the port may linger a moment after the previous cluster closed
		r.c, err = kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(r.port))
		if err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	require.NoError(r.t, err)
}

func (r *restartable) down() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.c != nil {
		r.c.Close()
		r.c = nil
	}
}

func (r *restartable) brokers() []string { return []string{fmt.Sprintf("127.0.0.1:%d", r.port)} }

// TestBrokerOutage: the broker goes away while webhooks keep coming. The receiver keeps
// answering 200, the outbox backlog grows and nothing is marked published; when the broker
// is back the backlog drains, each row published with its stable operation id.
func TestBrokerOutage(t *testing.T) {
	t.Parallel()
	n1, n2 := size(300, 3000), size(1000, 20000)
	b := newRestartable(t)
	d := newDB(t, effectsDDL)
	topic := "out-" + d.schema
	kafkatest.CreateTopicOn(t, b.brokers(), topic, 3)
	nd := newNode(t, d.schema, receiverFile(t, d.schema, topic), "receiver,relay", b.brokers(),
		map[string]string{"FAULTS_STRIPE_SECRET": faultsStripeSecret})
	p := nd.startReady()
	w := d.watch(t, "outbox")
	url := "http://" + nd.httpAddr + "/webhooks/stripe"
	before := make([]string, n1)
	for i := range before {
		before[i] = fmt.Sprintf("evt_bo_a_%06d", i)
	}
	var done tally
	deliverAll(t, url, before, 8, 0, &done, nil)
	until(t, w, p, time.Minute, "the first rows published", func() bool { return d.count(t, "outbox WHERE published_at IS NULL") == 0 })

	start := time.Now()
	b.down()
	during := make([]string, n2)
	for i := range during {
		during[i] = fmt.Sprintf("evt_bo_b_%06d", i)
	}
	_, statuses := deliverAll(t, url, during, 8, 0, &done, nil)
	require.Equal(t, map[int]int{200: n2}, statuses, "the receiver does not depend on the broker")
	backlog := d.count(t, "outbox WHERE published_at IS NULL")
	require.Equal(t, n2, backlog, "the backlog grows by every row written during the outage")
	// The relay logs each failed attempt: let it fail three more times against no broker.
	const failed = "error publishing to a topic"
	require.NoError(t, p.WaitLog(failed, strings.Count(p.Stderr(), failed)+3, time.Minute))
	require.Equal(t, n2, d.count(t, "outbox WHERE published_at IS NULL"), "nothing is marked published without a broker")
	outage := time.Since(start)

	b.up()
	kafkatest.CreateTopicOn(t, b.brokers(), topic, 3)
	until(t, w, p, 2*time.Minute, "the backlog drains", func() bool { return d.count(t, "outbox WHERE published_at IS NULL") == 0 })
	drained := time.Since(start) - outage
	records, distinct := checkTopic(t, b.brokers(), topic, "stripe", during)
	checkEffects(t, d, n1+n2)
	require.False(t, p.Exited())
	require.Equal(t, 0, p.Stop(t, stopTimeout))
	t.Logf("FIGURES broker-outage: before=%d during=%d backlog_max=%d outage=%s drained_in=%s records_after_return=%d distinct_operation_ids=%d lost=0 duplicated_effects=0",
		n1, n2, backlog, outage.Round(100*time.Millisecond), drained.Round(100*time.Millisecond), records, distinct)
}

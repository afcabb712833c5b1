package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/config"
	"github.com/idemd/idemd/internal/kafkatest"
	"github.com/idemd/idemd/internal/pgarray"
	"github.com/idemd/idemd/internal/pgtest"
)

// inProcess runs a daemon in this process, with its test signals initialised, until the
// returned stop is called (or the test ends); stop returns Run's error.
func inProcess(t *testing.T, cfg *daemonConfig) (d *daemon, stop func() error) {
	t.Helper()
	quiet := logrus.New()
	quiet.SetOutput(io.Discard)
	cfg.Logger = logrus.NewEntry(quiet)
	d, err := newDaemon(cfg)
	require.NoError(t, err)
	d.signals.topicsCreated.Init(t)
	d.signals.ready.Init(t)
	d.signals.drained.Init(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	var runErr error
	stopped := false
	stop = func() error {
		if !stopped {
			stopped = true
			cancel()
			runErr = <-done
		}
		return runErr
	}
	t.Cleanup(func() { _ = stop() })
	return d, stop
}

// TestDaemonFlushesTheOutboxOnShutdown: the daemon creates the pipelines' topic before it
// serves, and on shutdown its relay drains through Relay.Drain: rows committed just before
// the shutdown — here written without the NOTIFY that would wake the relay, with the
// relay's poll a second away — are published before Run returns.
func TestDaemonFlushesTheOutboxOnShutdown(t *testing.T) {
	t.Parallel()
	schema := testSchema(t)
	topic := kafkatest.Name(t, "flush")
	f, err := config.Parse("idemd.yaml", fmt.Appendf(nil, `sources:
  - name: stripe
    verify: {scheme: stripe, secrets_env: [FLUSH_STRIPE_SECRET]}
    publish: {topic: %s}
`, topic), func(string) (string, bool) { return stripeSecret, true })
	require.NoError(t, err)
	d, stop := inProcess(t, &daemonConfig{
		DatabaseURL: pgtest.URL(), Schema: schema, MaxConns: 6, Brokers: kafkatest.Brokers(t), CreateTopics: true,
		Pipelines: f, Roles: []role{roleReceiver, roleRelay}, Migrate: true,
		HTTPAddr: "127.0.0.1:0", AdminAddr: "127.0.0.1:0", ShutdownTimeout: 20 * time.Second,
	})
	require.Equal(t, []string{topic}, d.signals.topicsCreated.Wait(t))
	addrs := d.signals.ready.Wait(t)

	resp, err := http.DefaultClient.Do(stripeRequest(t, "http://"+addrs[0]+"/webhooks/stripe", stripeSecret, []byte(`{"id":"evt_flush"}`)))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	pool := pgtest.Pool(t, 1)
	_, err = pool.Exec(context.Background(), `INSERT INTO `+schema+`.outbox (operation_id, pipeline, causation_id, topic, payload)
SELECT gen_random_uuid(), 'stripe', 'quiet-' || i, $1, '{}' FROM generate_series(1, 50) i`, topic)
	require.NoError(t, err)

	require.NoError(t, stop())
	require.NoError(t, d.signals.drained.Wait(t), "the leader flushed the outbox")
	var unpublished int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM `+schema+`.outbox WHERE published_at IS NULL`).Scan(&unpublished))
	require.Zero(t, unpublished)
	require.Len(t, kafkatest.ReadAll(t, topic, 51, 30*time.Second), 51)
}

// TestDaemonOpensItsPoolAtStart: the daemon says it is ready with its pool's connections
// open, so that its first requests do not wait for PostgreSQL to start backends; each
// encodes the unit's arrays itself (internal/pgarray).
func TestDaemonOpensItsPoolAtStart(t *testing.T) {
	t.Parallel()
	f, err := config.Parse("idemd.yaml", []byte(`sources:
  - name: stripe
    verify: {scheme: stripe, secrets_env: [WARM_STRIPE_SECRET]}
    publish: {topic: warm}
`), func(string) (string, bool) { return stripeSecret, true })
	require.NoError(t, err)
	d, _ := inProcess(t, &daemonConfig{
		DatabaseURL: pgtest.URL(), Schema: testSchema(t), MaxConns: 5, Pipelines: f, Roles: []role{rolePruner}, Migrate: true,
		AdminAddr: "127.0.0.1:0", ShutdownTimeout: 20 * time.Second,
	})
	d.signals.ready.Wait(t)
	require.EqualValues(t, 5, d.pool.Stat().TotalConns())
	c, err := d.pool.Acquire(context.Background())
	require.NoError(t, err)
	defer c.Release()
	require.True(t, pgarray.Registered(c.Conn().TypeMap()))
}

// TestDaemonGroupCommitSettings: the daemon's receiver takes its group commit from
// HTTPMaxBatch (IDEMD_HTTP_MAX_BATCH): with 1, concurrent webhooks whose effect holds its
// transaction for 50 ms are committed one transaction each; with the receiver's default
// they share transactions.
func TestDaemonGroupCommitSettings(t *testing.T) {
	t.Parallel()
	const n = 16
	transactions := func(t *testing.T, maxBatch int) int {
		schema := testSchema(t)
		f, err := config.Parse("idemd.yaml", []byte(`sources:
  - name: stripe
    verify: {scheme: stripe, secrets_env: [BATCH_STRIPE_SECRET]}
    effect: {sql: "SELECT pg_sleep(0.05)"}
`), func(string) (string, bool) { return stripeSecret, true })
		require.NoError(t, err)
		d, _ := inProcess(t, &daemonConfig{
			DatabaseURL: pgtest.URL(), Schema: schema, MaxConns: 4, Pipelines: f, Roles: []role{roleReceiver}, Migrate: true,
			HTTPAddr: "127.0.0.1:0", AdminAddr: "127.0.0.1:0", ShutdownTimeout: 20 * time.Second, HTTPMaxBatch: maxBatch,
		})
		addrs := d.signals.ready.Wait(t)
		reqs := make([]*http.Request, n)
		for i := range reqs {
			reqs[i] = stripeRequest(t, "http://"+addrs[0]+"/webhooks/stripe", stripeSecret, fmt.Appendf(nil, `{"id":"evt_batch_%d"}`, i))
		}
		var wg sync.WaitGroup
		status := make([]int, n)
		for i, req := range reqs {
			wg.Go(func() {
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					status[i] = resp.StatusCode
					resp.Body.Close()
				}
			})
		}
		wg.Wait()
		require.Equal(t, slices.Repeat([]int{http.StatusOK}, n), status)
		var xids int
		require.NoError(t, pgtest.Pool(t, 1).QueryRow(context.Background(),
			`SELECT count(DISTINCT xmin::text) FROM `+schema+`.processed_messages`).Scan(&xids))
		return xids
	}
	require.Equal(t, n, transactions(t, 1), "IDEMD_HTTP_MAX_BATCH=1: one transaction per request")
	require.Less(t, transactions(t, 0), n, "the default batches concurrent requests")
}

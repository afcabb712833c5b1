package outbox_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/segmentio/kafka-go"
	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/metrics"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/outbox"
)

// signalHook sends each entry whose message contains match on ch.
type signalHook struct {
	match string
	ch    chan *logrus.Entry
}

func (h *signalHook) Levels() []logrus.Level { return logrus.AllLevels }

func (h *signalHook) Fire(e *logrus.Entry) error {
	if strings.Contains(e.Message, h.match) {
		select {
		case h.ch <- e:
		default:
		}
	}
	return nil
}

// failingWriter is a broker that refuses every record.
type failingWriter struct{}

func (failingWriter) WriteMessages(context.Context, ...kafka.Message) error {
	return errors.New("broker refuses")
}

func (failingWriter) Close() error { return nil }

// exported reports whether the registry exports a series of family name.
func exported(t *testing.T, name string) bool {
	t.Helper()
	families, err := metrics.Registry.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() == name {
			return len(f.GetMetric()) > 0
		}
	}
	return false
}

// TestRelayGaugesFollowLeadership: the outbox backlog gauges are exported by the leader
// only. A relay that loses its leadership while the process goes on (its lock connection
// dies) stops exporting them at once, so that max() over replicas is the new leader's
// value, never the former leader's last one.
//
// Not parallel: the gauges are the process's, and the parallel relay tests lead too.
func TestRelayGaugesFollowLeadership(t *testing.T) {
	b := setupRelay(t, 1, pgtest.Options{})
	b.enqueue(t, b.events(3, "held")...) // unpublished: a broker that refuses everything
	steppedDown := &signalHook{match: "standing by", ch: make(chan *logrus.Entry, 1)}
	log := quietLogger()
	log.Logger.SetLevel(logrus.WarnLevel)
	log.Logger.SetOutput(io.Discard)
	log.Logger.AddHook(steppedDown)
	r, _ := b.startRelay(t, outbox.RelayConfig{
		Writer:        failingWriter{},
		StatsInterval: time.Millisecond,
		StandbyPoll:   time.Hour, // once it stepped down, it stays a standby for the test
		BackoffMin:    time.Millisecond,
		BackoffMax:    5 * time.Millisecond,
		Logger:        log,
	})
	require.Eventually(t, func() bool {
		return r.IsLeader() && exported(t, "idemd_outbox_backlog") && exported(t, "idemd_outbox_oldest_unpublished_age_seconds")
	}, 20*time.Second, 5*time.Millisecond)
	require.EqualValues(t, 1, testutil.ToFloat64(metrics.RelayLeader))

	// Take the leadership away: end the session that holds the relay's advisory lock.
	key := outbox.RelayLockKey(b.db.Schema)
	var n int
	require.NoError(t, b.db.Pool.QueryRow(t.Context(), `SELECT count(pg_terminate_backend(pid)) FROM pg_locks
WHERE locktype = 'advisory' AND granted AND classid = (($1::bigint >> 32) & 4294967295)::oid AND objid = ($1::bigint & 4294967295)::oid AND objsubid = 1`,
		key).Scan(&n))
	require.Equal(t, 1, n, "the leader's lock session")
	select {
	case <-steppedDown.ch:
	case <-time.After(30 * time.Second):
		t.Fatal("the relay did not notice that it lost its lock")
	}
	require.False(t, r.IsLeader())
	require.False(t, exported(t, "idemd_outbox_backlog"), "a former leader exports no backlog")
	require.False(t, exported(t, "idemd_outbox_oldest_unpublished_age_seconds"), "a former leader exports no age")
	require.Zero(t, testutil.ToFloat64(metrics.RelayLeader))
}

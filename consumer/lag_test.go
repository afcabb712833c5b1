package consumer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/consumer"
	"github.com/idemd/idemd/internal/kafkatest"
	"github.com/idemd/idemd/internal/metrics"
)

// lagSeries returns the exported idemd_consumer_lag series of pipeline, by
// "topic/partition".
func lagSeries(t *testing.T, pipeline string) map[string]float64 {
	t.Helper()
	return partitionSeries(t, "idemd_consumer_lag", pipeline)
}

// partitionSeries returns the series of the per-partition family name whose pipeline label
// is pipeline, by "topic/partition" (their topic and partition labels).
func partitionSeries(t *testing.T, name, pipeline string) map[string]float64 {
	t.Helper()
	families, err := metrics.Registry.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["pipeline"] == pipeline {
				out[labels["topic"]+"/"+labels["partition"]] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// TestLagFromCommittedOffsets: the lag is the broker's high-water mark minus the group's
// committed offset. It counts every record before the group committed anything, drops to
// zero once a consumer applied and committed them, grows again while no consumer commits
// (a stuck or dead consumer), and a partition the process no longer holds, or all of them
// once the monitor stops, are no longer exported.
func TestLagFromCommittedOffsets(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	name := kafkatest.Name(t, "lag")
	produce(t, b.brokers, b.topic, perPartition(5, 3)...)

	owned := func(string, int) bool { return true }
	m, err := consumer.NewLagMonitor(&consumer.LagConfig{
		Name: name, Brokers: b.brokers, Topics: []string{b.topic}, Group: b.group,
		Owned: func(topic string, p int) bool { return owned(topic, p) },
	})
	require.NoError(t, err)
	ctx := t.Context()
	p0, p1 := b.topic+"/0", b.topic+"/1"

	lag, err := m.Poll(ctx)
	require.NoError(t, err)
	require.Equal(t, map[string]map[int]int64{b.topic: {0: 5, 1: 3}}, lag)
	require.Equal(t, map[string]float64{p0: 5, p1: 3}, lagSeries(t, name), "nothing committed yet: every record counts")

	cfg := b.config()
	cfg.Name = name
	stop := start(t, b.db, cfg)
	b.until(t, 30*time.Second, "8 effects", func() bool { return b.db.Count(t, "{schema}.effects") == 8 })
	stop() // commits the offsets of what it applied, then leaves the group

	_, err = m.Poll(ctx)
	require.NoError(t, err)
	require.Equal(t, map[string]float64{p0: 0, p1: 0}, lagSeries(t, name))

	// Nobody consumes now: the lag grows with every record produced.
	produce(t, b.brokers, b.topic, msg("a5", 0, ""), msg("a6", 0, ""), msg("a7", 0, ""), msg("a8", 0, ""))
	_, err = m.Poll(ctx)
	require.NoError(t, err)
	require.Equal(t, map[string]float64{p0: 4, p1: 0}, lagSeries(t, name))

	// A rebalance moved partition 0 away: its series goes, partition 1 stays.
	owned = func(_ string, p int) bool { return p == 1 }
	_, err = m.Poll(ctx)
	require.NoError(t, err)
	require.Equal(t, map[string]float64{p1: 0}, lagSeries(t, name))

	// A monitor that stops (the process lost the consumer role) exports nothing.
	stopped, cancel := context.WithCancel(ctx)
	cancel()
	require.NoError(t, m.Run(stopped))
	require.Empty(t, lagSeries(t, name))
}

// TestLagUnknownTopic: a topic that does not exist has no series, and is not an error.
func TestLagUnknownTopic(t *testing.T) {
	t.Parallel()
	name := kafkatest.Name(t, "lag")
	m, err := consumer.NewLagMonitor(&consumer.LagConfig{
		Name: name, Brokers: kafkatest.Brokers(t), Topics: []string{kafkatest.Name(t, "missing")},
	})
	require.NoError(t, err)
	lag, err := m.Poll(t.Context())
	require.NoError(t, err)
	require.Empty(t, lag)
	require.Empty(t, lagSeries(t, name))
}

// TestLagFollowsRebalance: the lag monitor of a running consumer exports the partitions that
// consumer holds in the group's current generation (Consumer.Owns): when a second member
// joins and takes a partition, the first one's series for it is deleted, so a sum over
// replicas counts each partition once.
func TestLagFollowsRebalance(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	run := func(cfg *consumer.Config) *consumer.Consumer {
		c, err := consumer.New(b.db.Pool, cfg)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = c.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		return c
	}
	// A name of its own: the lag series live in the process-wide registry.
	name := kafkatest.Name(t, "lagrb")
	cfg := b.config()
	cfg.Name = name
	first := run(cfg)
	produce(t, b.brokers, b.topic, msg("a0", 0, ""), msg("b0", 1, ""))
	b.waitCommitted(t, 30*time.Second, func(offs []int64) bool { return offs[0] == 1 && offs[1] == 1 })

	m, err := consumer.NewLagMonitor(&consumer.LagConfig{
		Name: name, Brokers: b.brokers, Topics: []string{b.topic}, Group: b.group, Owned: first.Owns,
	})
	require.NoError(t, err)
	_, err = m.Poll(t.Context())
	require.NoError(t, err)
	require.Len(t, lagSeries(t, name), 2, "the only member holds both partitions")

	// A second member joins and is given a partition; once it committed there, the
	// partition is its own.
	assigned, moved := make(chan int, 10), make(chan int, 10)
	second := b.config()
	second.Name = name
	second.OnAssign = func(_ int32, held map[string][]int) {
		for _, p := range held[b.topic] {
			assigned <- p
		}
	}
	second.OnOffsetCommit = func(topic string, p int, next int64) {
		b.commits.Record(topic, p, next)
		moved <- p
	}
	run(second)
	select {
	case <-assigned:
	case <-time.After(60 * time.Second):
		t.Fatal("the second member was never given a partition")
	}
	produce(t, b.brokers, b.topic, msg("a1", 0, ""), msg("b1", 1, ""))
	var p int
	select {
	case p = <-moved:
	case <-time.After(60 * time.Second):
		t.Fatal("the second member never committed")
	}
	require.False(t, first.Owns(b.topic, p), "the partition moved to the second member")
	_, err = m.Poll(t.Context())
	require.NoError(t, err)
	series := lagSeries(t, name)
	require.Len(t, series, 1, "only the partition the first member still holds: %v", series)
	require.NotContains(t, series, fmt.Sprintf("%s/%d", b.topic, p))
}

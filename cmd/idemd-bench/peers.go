package main

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// benchPeers puts idemd's consumer beside idiomatic Watermill and a hand-written kafka-go
// consumer (bench/peers, its own module, run as -peers-bin) on one topic of -peer-messages
// records (20% duplicates) on -peer-partitions partitions. Each does the same database work
// per message and runs with its outbound relay (idemd's relay, Watermill's Forwarder; the
// kafka-go consumer only writes its outbox rows). All are timed alike, from their first
// effect row to their last.
func benchPeers(ctx context.Context, e *env, res *Results) error {
	if e.o.peersBin == "" {
		res.Notes = append(res.Notes, "peers: skipped (no -peers-bin; build it with: go build -C bench/peers -o idemd-peers .)")
		e.logf("peers: skipped, no -peers-bin")
		return nil
	}
	n, parts := e.o.peerMessages, e.o.peerPartitions
	recs, unique := records("evt-"+e.runID+"-peers", n, parts)
	topic, err := e.topic(ctx, "peers", parts)
	if err != nil {
		return err
	}
	e.logf("producing %d records (%d distinct ids) to %s", n, unique, topic)
	if _, err := e.produce(ctx, topic, recs, parts); err != nil {
		return err
	}
	if err := e.truncate(ctx); err != nil {
		return err
	}
	idemd, err := e.runConsumer(ctx, consumerRun{
		name: fmt.Sprintf("peers: idemd, BatchSize %d, relay running", e.o.batch), batch: e.o.batch, partitions: parts,
		relay: true, byEffects: true, recs: recs, unique: unique, topic: topic,
	})
	if err != nil {
		return err
	}
	idemd.Section = "peers"
	res.PeersIdemd = idemd
	res.Peers = append(res.Peers, idemd)
	for _, p := range []struct {
		mode, name string
		out        **Row
	}{
		{"watermill", "peers: Watermill (kafka subscriber, pgx tx per message, sql forwarder)", &res.PeersWatermill},
		{"kafkago", fmt.Sprintf("peers: kafka-go, %d readers, one tx per message", parts), &res.PeersKafkaGo},
	} {
		row, err := e.runPeer(ctx, p.mode, p.name, topic, parts, len(recs), unique)
		if err != nil {
			return fmt.Errorf("peer %s: %w", p.mode, err)
		}
		*p.out = row
		res.Peers = append(res.Peers, row)
	}
	return nil
}

// runPeer runs one peer consumer on topic until it wrote every distinct id's effect.
func (e *env) runPeer(ctx context.Context, mode, name, topic string, partitions, n, unique int) (*Row, error) {
	if err := e.truncate(ctx); err != nil {
		return nil, err
	}
	out, err := e.topic(ctx, "peers-out-"+mode, partitions)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(e.o.peersBin, "-mode", mode, "-database-url", e.url, "-schema", e.schema,
		"-brokers", strings.Join(e.brokers, ","), "-topic", topic, "-group", "bench-"+e.runID+"-peer-"+mode,
		"-out-topic", out, "-partitions", fmt.Sprint(partitions), "-conns", fmt.Sprint(partitions+4))
	c, err := e.startProcess(ctx, "peer "+mode, cmd)
	if err != nil {
		return nil, err
	}
	begin := time.Now()
	first, last, err := e.waitEffects(ctx, unique, 15*time.Minute)
	if err != nil {
		c.kill()
		return nil, err
	}
	rss, effects, err := e.stopAndCount(ctx, c)
	if err != nil {
		return nil, err
	}
	if effects != unique {
		return nil, fmt.Errorf("%d effects for %d distinct ids", effects, unique)
	}
	window := last.Sub(first)
	rate := float64(n) / window.Seconds()
	e.logf("%s: %d msgs in %s: %.0f msgs/s, peak RSS %.1f MiB", name, n, window.Round(time.Millisecond), rate, rss)
	return &Row{Section: "peers", Mode: name, Count: n, Seconds: window.Seconds(), Rate: rate, Unit: "msgs/s", PeakRSSMiB: rss,
		Note: fmt.Sprintf("%d records, %d distinct ids on %d partitions; rate from first to last effect row (from process start: %.0f msgs/s)",
			n, unique, partitions, float64(n)/last.Sub(begin).Seconds())}, nil
}

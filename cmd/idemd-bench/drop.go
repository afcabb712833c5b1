package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/idemd/idemd/processed"
)

// benchDrop measures what dropping an expired epoch of processed_messages costs the
// receiver, at the size an epoch has in production rather than the prune section's
// epochs of seconds: the current epoch is filled with -drop-rows records that have all
// expired (received over 7 days, the default interval with 7 days of retention, 7 days
// ago and more), vacuumed and analyzed as autovacuum would have done over those days,
// and the next epoch opened, so that the filled one is the oldest, due to be dropped.
// Then the group-committed receiver, in a child, takes -relay-rate webhooks/s for
// -drop-duration (after 1 s of warm-up at that rate), and a third of the way in the bench
// drops the epoch as the pruner does (processed.Store.DropExpiredEpochs: the checks that
// every record expired and none holds a lease, then one transaction that detaches and
// drops the partition, which locks processed_messages against every claim meanwhile).
//
// Each webhook's latency is from the time it was due on the rate's schedule to its 200
// answer, so that a request held back by a stalled connection counts the stall (a
// latency from its send would hide it: coordinated omission). The webhooks due while the
// drop ran are reported apart from those before it.
func benchDrop(ctx context.Context, e *env, res *Results) error {
	if err := e.truncate(ctx); err != nil {
		return err
	}
	q := e.q()
	began := time.Now()
	// Received 7 days and 1 to 168 hours ago, with 7 days of retention: expired 1 to 168
	// hours ago, in random key order as traffic inserts them.
	if _, err := e.pool.Exec(ctx, `INSERT INTO `+q+`.processed_messages
    (scope, message_id, fingerprint, status, received_at, completed_at, expires_at, epoch)
SELECT '`+defaultSource+`', 'evt_' || md5('expired-' || g), sha256(int8send(g)), 'done', t, t, t + interval '7 days',
       (SELECT max(epoch) FROM `+q+`.processed_epochs)
FROM (SELECT g, now() - interval '7 days' - ((g % 168) + 1) * interval '1 hour' AS t
      FROM generate_series(1, $1::bigint) g) s`, e.o.dropRows); err != nil {
		return fmt.Errorf("filling the epoch to drop: %w", err)
	}
	if _, err := e.pool.Exec(ctx, "VACUUM (ANALYZE) "+q+".processed_messages"); err != nil {
		return err
	}
	// Then a checkpoint: over the epoch's days the server would have written these pages
	// out long before the drop, not while the load runs (a 10 M fill's checkpoint, running
	// during the load, put the p99 of the webhooks before the drop at 36 ms, against 5).
	if _, err := e.pool.Exec(ctx, "CHECKPOINT"); err != nil {
		return err
	}
	var mib float64
	if err := e.pool.QueryRow(ctx, `SELECT coalesce(sum(pg_total_relation_size(relid)), 0)::float8 / 1048576 FROM pg_partition_tree('`+q+`.processed_messages'::regclass) WHERE isleaf`).Scan(&mib); err != nil {
		return err
	}
	if _, err := e.claims.OpenEpoch(ctx, e.pool, 0); err != nil {
		return err
	}
	e.logf("drop: filled an epoch with %d expired records (%.0f MiB with its indexes) in %s", e.o.dropRows, mib, time.Since(began).Round(time.Millisecond))

	c, err := e.startChild(ctx, "receiver", childConfig{
		MaxConns: int32(e.o.receiverConns), OutboxTopic: "bench.webhooks", Batch: e.o.maxBatch, Secret: stripeSecret, Linger: e.o.linger,
		ProfileName: "receiver-drop",
	})
	if err != nil {
		return err
	}
	defer c.kill()
	url := "http://" + c.Ready + "/webhooks/" + defaultSource
	warm, err := e.loadWebhooks(ctx, url, "dropwarm", receiverWarmUp, e.o.relayRate, nil, nil)
	if err != nil {
		return err
	}
	var (
		total     = int(float64(e.o.relayRate)*e.o.dropDuration.Seconds()) + e.o.concurrency + 1
		answered  = make([]atomic.Int64, total)
		dropped   []processed.DroppedEpoch
		dropErr   error
		dropStart time.Time
		dropEnd   time.Time
		done      = make(chan struct{})
	)
	// The schedule's start: loadWebhooks starts its own clock a few microseconds later.
	begin := time.Now()
	go func() {
		defer close(done)
		select {
		case <-time.After(e.o.dropDuration / 3):
		case <-ctx.Done():
			return
		}
		dropStart = time.Now()
		dropped, dropErr = e.claims.DropExpiredEpochs(ctx, e.pool)
		dropEnd = time.Now()
	}()
	st, err := e.loadWebhooks(ctx, url, "drop", e.o.dropDuration, e.o.relayRate, nil, answersInto(answered))
	<-done
	if err != nil {
		return err
	}
	if dropErr != nil {
		return fmt.Errorf("dropping the expired epoch: %w", dropErr)
	}
	if len(dropped) != 1 || dropped[0].Records != int64(e.o.dropRows) {
		return fmt.Errorf("dropping the expired epoch: dropped %+v, want one epoch of %d records", dropped, e.o.dropRows)
	}
	if dropEnd.After(begin.Add(e.o.dropDuration)) {
		return fmt.Errorf("the drop took %s and ended after the load (-drop-duration %s): make it longer", dropEnd.Sub(dropStart).Round(time.Millisecond), e.o.dropDuration)
	}
	cpu, rss, err := e.stopPacedChild(ctx, c, warm, st, "drop")
	if err != nil {
		return err
	}
	interval := time.Second / time.Duration(e.o.relayRate)
	var all, before, during []time.Duration
	for i := 1; i < len(answered); i++ {
		at := answered[i].Load()
		if at == 0 {
			continue
		}
		due := begin.Add(time.Duration(i-1) * interval)
		d := max(time.Unix(0, at).Sub(due), 0)
		all = append(all, d)
		switch {
		case due.Before(dropStart):
			before = append(before, d)
		case !due.After(dropEnd):
			during = append(during, d)
		}
	}
	d := dropped[0]
	res.Drop = &Row{Section: "drop", Mode: fmt.Sprintf("receiver at %d webhooks/s, an epoch of %s expired records dropped", e.o.relayRate, human(e.o.dropRows)),
		Count: int(st.ok), Seconds: st.elapsed.Seconds(), Rate: float64(st.ok) / st.elapsed.Seconds(), Unit: "webhooks/s",
		P50ms: percentile(all, 0.50), P99ms: percentile(all, 0.99), P999ms: percentile(all, 0.999), PeakRSSMiB: rss, CPU: cpu,
		Note: fmt.Sprintf("latency from each webhook's due time on the schedule to its 200; the partition: %.0f MiB with its indexes; the drop took %s (its checks, processed_messages locked %s for the detach and the drop until the commit, then the files removed once the lock is released); the %d webhooks due during it: p50 %.1f ms, p99 %.1f ms, worst %.1f ms; the %d due before it: p99 %.1f ms, worst %.1f ms",
			mib, dropEnd.Sub(dropStart).Round(time.Millisecond), d.Locked.Round(100*time.Microsecond), len(during), percentile(during, 0.5), percentile(during, 0.99), percentile(during, 1),
			len(before), percentile(before, 0.99), percentile(before, 1))}
	res.DropRows, res.DropDuringP99, res.DropWorst = e.o.dropRows, percentile(during, 0.99), percentile(during, 1)
	e.logf("drop: the epoch of %d records dropped in %s (%s locked); webhooks due meanwhile p99 %.1f ms, worst %.1f ms", d.Records,
		dropEnd.Sub(dropStart).Round(time.Millisecond), d.Locked.Round(100*time.Microsecond), res.DropDuringP99, res.DropWorst)
	return nil
}

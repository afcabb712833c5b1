package daemon

import (
	"context"
	"errors"
	"time"

	"github.com/idemd/idemd/internal/metrics"
	"github.com/idemd/idemd/outbox"
	"github.com/idemd/idemd/processed"
)

// startPruner deletes expired dedup records and published outbox rows every PruneInterval,
// in bounded batches. Several pruners (one per process) are harmless: each batch is its own
// short transaction and deleting an already deleted row is a no-op.
func (d *Daemon) startPruner(start starter) {
	log := d.cfg.Logger.WithField("component", "pruner")
	pctx, cancel := context.WithCancel(context.Background())
	p := &part{name: RolePruner}
	p.stop = func(ctx context.Context) error {
		cancel()
		select {
		case <-p.done:
		case <-ctx.Done():
		}
		return nil
	}
	start(p, func(context.Context) error {
		store, err := processed.New(&processed.Config{Schema: d.cfg.Schema})
		if err != nil {
			return err
		}
		ob := outbox.New(&outbox.Config{Schema: d.cfg.Schema})
		tick := time.NewTicker(d.cfg.PruneInterval)
		defer tick.Stop()
		for {
			n, err := store.Prune(pctx, d.pool, 0)
			metrics.Pruned.WithLabelValues("processed_messages").Add(float64(n))
			if err != nil && !errors.Is(err, context.Canceled) {
				log.WithError(err).Error("error pruning processed messages")
			}
			m, err := ob.PrunePublished(pctx, d.pool, d.cfg.OutboxRetention, 0)
			metrics.Pruned.WithLabelValues("outbox").Add(float64(m))
			if err != nil && !errors.Is(err, context.Canceled) {
				log.WithError(err).Error("error pruning the outbox")
			}
			if n+m > 0 {
				log.WithField("processed_messages", n).WithField("outbox", m).Info("pruned")
			}
			select {
			case <-pctx.Done():
				return nil
			case <-tick.C:
			}
		}
	})
}

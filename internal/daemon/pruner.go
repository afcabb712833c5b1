package daemon

import (
	"context"

	"github.com/idemd/idemd/internal/pruner"
)

// startPruner runs the pruner role (internal/pruner) every PruneInterval. Several pruners
// (one per process) are harmless: each batch is its own short transaction and deleting an
// already deleted row is a no-op.
func (d *Daemon) startPruner(start starter) {
	pctx, cancel := context.WithCancel(context.Background())
	p := &part{name: RolePruner}
	p.stop = func(ctx context.Context) error {
		// A pruner cut short loses nothing: the next one deletes the rest.
		_ = p.cancelAndWait(ctx, cancel, "the pruner")
		return nil
	}
	start(p, func(context.Context) error {
		pr, err := pruner.New(d.pool, &pruner.Config{
			Schema: d.cfg.Schema, Interval: d.cfg.PruneInterval, OutboxRetention: d.cfg.OutboxRetention,
			DeadLetterRetention: d.cfg.DeadLetterRetention, DeadLetterReplayedRetention: d.cfg.DeadLetterReplayedRetention,
			EntityVersionRetention: d.cfg.EntityVersionRetention, Logger: d.cfg.Logger,
		})
		if err != nil {
			return err
		}
		return pr.Run(pctx)
	})
}

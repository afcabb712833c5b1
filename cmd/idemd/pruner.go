package main

import (
	"cmp"
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sirupsen/logrus"

	"github.com/idemd/idemd/admin"
	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/delivery"
	"github.com/idemd/idemd/internal/metrics"
	"github.com/idemd/idemd/outbox"
	"github.com/idemd/idemd/processed"
)

// Defaults of prunerConfig.
const (
	pruneIntervalDefault   = time.Minute
	outboxRetentionDefault = 24 * time.Hour
	// entityVersionRetentionDefault keeps the stale-event guard's versions for 30 days.
	entityVersionRetentionDefault = 30 * 24 * time.Hour
)

// prunerConfig configures a pruner.
type prunerConfig struct {
	// Schema holds idemd's tables. Defaults to "idemd".
	Schema string
	// Interval is the pause between two pruning rounds. Defaults to 1 minute.
	Interval time.Duration
	// OutboxRetention is how long published outbox rows, and finished (delivered or dead)
	// HTTP deliveries, are kept for inspection and replays. Defaults to 24 hours.
	OutboxRetention time.Duration
	// DeadLetterRetention is how long a dead letter is kept, replayed or not; the admin
	// audit is kept as long. Defaults to 30 days (deadletter.RetentionDefault).
	DeadLetterRetention time.Duration
	// DeadLetterReplayedRetention is how long a dead letter is kept after its replay.
	// Defaults to 7 days (deadletter.ReplayedRetentionDefault).
	DeadLetterReplayedRetention time.Duration
	// EntityVersionRetention is how long the stale-event guard remembers an entity's last
	// version after its last update. Defaults to 30 days.
	EntityVersionRetention time.Duration
	// PartitionInterval, when positive, opens an epoch of processed_messages this often
	// and drops the expired ones whole (processed.Store.PruneEpochs) instead of deleting
	// expired records row by row; with mixed retentions, the records an epoch would keep
	// more than its span past their retention are still deleted row by row. 0: row by row.
	PartitionInterval time.Duration
	// BatchSize bounds each DELETE. Defaults to the stores' (1000).
	BatchSize int
	// Logger receives the pruner's logs. Defaults to logrus's standard logger.
	Logger *logrus.Entry
}

// pruner is the pruner role: it deletes expired dedup records, old conflicts, published
// outbox rows and finished HTTP deliveries through the stores' Prune methods, in bounded
// batches, so that no statement holds many locks or runs long. Guarantee: a dedup record is
// deleted only after its retention passed (until then its id stays a duplicate), and an
// outbox row only after it was published.
type pruner struct {
	pool      *pgxpool.Pool
	cfg       prunerConfig
	processed *processed.Store
	outbox    *outbox.Store
	delivery  *delivery.Store
	letters   *deadletter.Store
	audit     *admin.Audit
	log       *logrus.Entry
}

// newPruner returns a pruner on pool.
func newPruner(pool *pgxpool.Pool, cfg *prunerConfig) (*pruner, error) {
	c := prunerConfig{}
	if cfg != nil {
		c = *cfg
	}
	c.Interval = cmp.Or(c.Interval, pruneIntervalDefault)
	c.OutboxRetention = cmp.Or(c.OutboxRetention, outboxRetentionDefault)
	c.DeadLetterRetention = cmp.Or(c.DeadLetterRetention, deadletter.RetentionDefault)
	c.DeadLetterReplayedRetention = cmp.Or(c.DeadLetterReplayedRetention, deadletter.ReplayedRetentionDefault)
	c.EntityVersionRetention = cmp.Or(c.EntityVersionRetention, entityVersionRetentionDefault)
	if c.Logger == nil {
		c.Logger = logrus.NewEntry(logrus.StandardLogger())
	}
	ps, err := processed.New(&processed.Config{Schema: c.Schema})
	if err != nil {
		return nil, err
	}
	return &pruner{
		pool: pool, cfg: c, processed: ps,
		outbox:   outbox.New(&outbox.Config{Schema: c.Schema}),
		delivery: delivery.NewStore(c.Schema),
		letters:  deadletter.New(c.Schema),
		audit:    admin.NewAudit(c.Schema),
		log:      c.Logger.WithField("component", "pruner"),
	}, nil
}

// Run prunes every Interval until ctx ends.
func (p *pruner) Run(ctx context.Context) error {
	if p.cfg.PartitionInterval > 0 {
		p.log.Infof("pruning dedup records by epochs: a partition of processed_messages opens every %s and is dropped whole once its records expired (IDEMD_PROCESSED_PARTITION_INTERVAL)", p.cfg.PartitionInterval)
	} else {
		p.log.Info("pruning dedup records row by row (IDEMD_PROCESSED_PARTITION_INTERVAL=0)")
	}
	for {
		p.Once(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(p.cfg.Interval):
		}
	}
}

// Once runs one pruning round and returns how many dedup records and outbox rows (HTTP
// deliveries included) it deleted. Errors are logged, not returned: the next round tries
// again.
func (p *pruner) Once(ctx context.Context) (records, rows int64) {
	records = p.pruneRecords(ctx)
	rows, err := p.outbox.PrunePublished(ctx, p.pool, p.cfg.OutboxRetention, p.cfg.BatchSize)
	metrics.Pruned.WithLabelValues("outbox").Add(float64(rows))
	if err != nil && ctx.Err() == nil {
		p.log.WithError(err).Warn("error pruning published outbox rows; retrying next round")
	}
	deliveries, err := p.delivery.PruneFinished(ctx, p.pool, p.cfg.OutboxRetention, p.cfg.BatchSize)
	metrics.Pruned.WithLabelValues("http_deliveries").Add(float64(deliveries))
	if err != nil && ctx.Err() == nil {
		p.log.WithError(err).Warn("error pruning finished HTTP deliveries; retrying next round")
	}
	rows += deliveries
	p.pruneOperatorTables(ctx)
	if records+rows > 0 {
		p.log.WithField("records", records).WithField("outbox_rows", rows).Info("pruned expired rows")
	}
	return records, rows
}

// pruneRecords prunes expired dedup records: by epochs when PartitionInterval is set, else
// row by row (and the epochs left from when it was set, once expired). It returns how many
// records it deleted or dropped.
func (p *pruner) pruneRecords(ctx context.Context) int64 {
	var (
		round   processed.EpochRound
		deleted int64
		err     error
	)
	if p.cfg.PartitionInterval > 0 {
		round, err = p.processed.PruneEpochs(ctx, p.pool, p.cfg.PartitionInterval, p.cfg.BatchSize)
	} else {
		var errDrop error
		deleted, err = p.processed.Prune(ctx, p.pool, p.cfg.BatchSize)
		round.Dropped, errDrop = p.processed.DropExpiredEpochs(ctx, p.pool)
		err = errors.Join(err, errDrop)
	}
	records := deleted + round.Records()
	metrics.Pruned.WithLabelValues("processed_messages").Add(float64(records))
	if round.Opened > 0 {
		p.log.WithField("epoch", round.Opened).Info("opened an epoch of processed_messages: new records go to its partition")
	}
	for _, d := range round.Dropped {
		p.log.WithField("epoch", d.Epoch).WithField("records", d.Records).WithField("duration", d.Locked.Seconds()).
			Info("dropped an expired epoch of processed_messages, its partition whole; claims waited at most duration seconds for it")
	}
	if n, errCount := p.processed.Epochs(ctx, p.pool); errCount == nil {
		metrics.ProcessedEpochs.Set(float64(n))
	} else {
		err = errors.Join(err, errCount)
	}
	if err != nil && ctx.Err() == nil {
		p.log.WithError(err).Warn("error pruning expired dedup records; retrying next round")
	}
	return records
}

// pruneOperatorTables prunes what operators read: dead letters, the admin audit and the
// stale-event guard's entity versions. Errors are logged; the next round tries again.
func (p *pruner) pruneOperatorTables(ctx context.Context) {
	steps := []struct {
		table string
		prune func() (int64, error)
	}{
		{"dead_letters", func() (int64, error) {
			return p.letters.Prune(ctx, p.pool, p.cfg.DeadLetterRetention, p.cfg.DeadLetterReplayedRetention, p.cfg.BatchSize)
		}},
		{"admin_audit", func() (int64, error) {
			return p.audit.Prune(ctx, p.pool, p.cfg.DeadLetterRetention, p.cfg.BatchSize)
		}},
		{"entity_versions", func() (int64, error) {
			return p.processed.PruneEntityVersions(ctx, p.pool, p.cfg.EntityVersionRetention, p.cfg.BatchSize)
		}},
	}
	for _, st := range steps {
		n, err := st.prune()
		metrics.Pruned.WithLabelValues(st.table).Add(float64(n))
		if err != nil && ctx.Err() == nil {
			p.log.WithError(err).WithField("table", st.table).Warn("error pruning; retrying next round")
		}
		if n > 0 {
			p.log.WithField("table", st.table).WithField("rows", n).Info("pruned old rows")
		}
	}
}

// startPruner runs the pruner role every PruneInterval. Several pruners (one per process)
// are harmless: each batch is its own short transaction and deleting an already deleted row
// is a no-op.
func (d *daemon) startPruner(start starter) {
	pctx, cancel := context.WithCancel(context.Background())
	p := &part{role: rolePruner, name: "the pruner"}
	p.stop = func(ctx context.Context) error {
		// A pruner cut short loses nothing: the next one deletes the rest.
		_ = p.cancelAndWait(ctx, cancel)
		return nil
	}
	start(p, func(context.Context) error {
		pr, err := newPruner(d.pool, &prunerConfig{
			Schema: d.cfg.Schema, Interval: d.cfg.PruneInterval, OutboxRetention: d.cfg.OutboxRetention,
			DeadLetterRetention: d.cfg.DeadLetterRetention, DeadLetterReplayedRetention: d.cfg.DeadLetterReplayedRetention,
			EntityVersionRetention: d.cfg.EntityVersionRetention, PartitionInterval: d.cfg.PartitionInterval,
			Logger: d.cfg.Logger,
		})
		if err != nil {
			return err
		}
		return pr.Run(pctx)
	})
}

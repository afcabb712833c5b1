package processed

import (
	"cmp"
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PruneBatchDefault is how many rows one prune statement deletes at most.
const PruneBatchDefault = 1000

// Prune deletes expired records (PruneRecords) and expired conflicts (PruneConflicts). It
// returns how many records it deleted.
func (s *Store) Prune(ctx context.Context, pool *pgxpool.Pool, batchSize int) (int64, error) {
	total, err := s.PruneRecords(ctx, pool, batchSize)
	if err != nil {
		return total, err
	}
	return total, s.PruneConflicts(ctx, pool, batchSize)
}

// PruneRecords deletes expired records, row by row, in batches of at most batchSize rows,
// each batch its own short transaction, until none is left or ctx ends; it goes through
// every epoch's partition. It returns how many records it deleted. A record is expired when
// its retention has passed; an in-flight reservation is kept while its lease is live.
// With epochs opened at an interval, DropExpiredEpochs is the pruning that writes nothing
// per record.
func (s *Store) PruneRecords(ctx context.Context, pool *pgxpool.Pool, batchSize int) (int64, error) {
	return s.pruneRecords(ctx, pool, batchSize, false)
}

// PruneOutlived deletes, as PruneRecords does but only those, the expired records that
// their epoch would keep more than its span (how long it took new records) past their
// expiry: those that expired before the last expiry of their epoch minus its span. It is
// the part of pruning by epochs that writes per record, and only with mixed retentions:
// an API key kept 24 hours, in an epoch that also holds webhooks kept 7 days, is deleted
// once expired instead of staying until the epoch is dropped. When all records of an epoch
// have one retention, they expire within one span of its last expiry and none is deleted:
// the epoch goes whole. So every record stays at most one span past its retention.
func (s *Store) PruneOutlived(ctx context.Context, pool *pgxpool.Pool, batchSize int) (int64, error) {
	return s.pruneRecords(ctx, pool, batchSize, true)
}

func (s *Store) pruneRecords(ctx context.Context, pool *pgxpool.Pool, batchSize int, outlived bool) (int64, error) {
	batchSize = cmp.Or(batchSize, PruneBatchDefault)
	// An epoch's span runs from its opening to the next one's, or to now for the current one.
	rows, err := pool.Query(ctx, `SELECT epoch, (extract(epoch FROM coalesce(lead(opened_at) OVER (ORDER BY epoch), now()) - opened_at) * 1e6)::bigint FROM `+s.table("processed_epochs")+` ORDER BY epoch`)
	if err != nil {
		return 0, fmt.Errorf("error pruning processed messages: %w", err)
	}
	type epochSpan struct {
		Epoch int32
		Span  int64
	}
	epochs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[epochSpan])
	if err != nil {
		return 0, fmt.Errorf("error pruning processed messages: %w", err)
	}
	var total int64
	for _, e := range epochs {
		q := pruneSQL(s.partition(e.Epoch))
		var span any // NULL: every expired record
		if outlived {
			span = e.Span
		}
		for {
			tag, err := execByIndex(ctx, pool, q, batchSize, span)
			if goneEpoch(err) {
				break // dropped by another pruner since listed
			}
			if err != nil {
				return total, fmt.Errorf("error pruning processed messages: %w", err)
			}
			total += tag.RowsAffected()
			if tag.RowsAffected() < int64(batchSize) {
				break
			}
		}
	}
	return total, nil
}

// PruneConflicts deletes expired conflicts (kept for their record's retention), in batches
// of at most batchSize rows.
func (s *Store) PruneConflicts(ctx context.Context, pool *pgxpool.Pool, batchSize int) error {
	batchSize = cmp.Or(batchSize, PruneBatchDefault)
	for _, q := range []string{s.sql.pruneConflictsExpired, s.sql.pruneConflicts} {
		for {
			args := []any{batchSize}
			if q == s.sql.pruneConflicts {
				args = append(args, s.retention.Microseconds())
			}
			tag, err := pool.Exec(ctx, q, args...)
			if err != nil {
				return fmt.Errorf("error pruning conflicts: %w", err)
			}
			if tag.RowsAffected() < int64(batchSize) {
				break
			}
		}
	}
	return nil
}

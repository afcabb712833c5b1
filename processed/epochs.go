package processed

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/pgerr"
)

// Epochs are the time partitions of processed_messages (migration 0009). With them, expired
// records go a partition at a time, dropped whole, instead of row by row: nothing is
// written per record and nothing is left for VACUUM.
//
// Guarantee: a claim sees every record of every live epoch, so an id stays a duplicate for
// its whole retention whichever epoch holds it. The current epoch (the highest in
// processed_epochs) takes the new records; a claim checks the older epochs for its id
// before inserting (queries.go). Each claim takes the epochs' advisory lock in shared mode,
// in its own statement before the claim's, and OpenEpoch takes it exclusively to open the
// next epoch. So when an epoch opens, every transaction that claimed in the one before has
// ended, and a claim in the new epoch sees, in its snapshot, all that they wrote; two
// claims of one id at the same time always insert into the same epoch, where the primary
// key makes one of them wait for the other. The lock has a second use: a claim statement
// lists processed_messages' partitions when it locks the table, which it does after the
// epochs' lock, so it always knows the partition of the epoch it reads. An INSERT that
// takes no such lock can read a new epoch yet route its row with the partitions it listed
// a moment before: "no partition of relation found for row" (BENCHMARKS.md, phase 26).
//
// An epoch's partition is dropped once every record in it has expired and no reservation
// in it holds a live lease; a record taken over after its retention moves to the current
// epoch. With mixed retentions, the records that their epoch would keep more than one span
// past their retention are deleted row by row (PruneOutlived). Records therefore stay up
// to one epoch's interval past their retention.

// EpochLockTimeout bounds how long opening an epoch, or dropping one, waits for the claims
// in flight; new claims queue behind it meanwhile. On timeout the step is tried again at
// the next pruning round.
const EpochLockTimeout = 2 * time.Second

// setLockTimeout is the first statement of the transactions that open and drop epochs.
var setLockTimeout = "SET LOCAL lock_timeout = " + strconv.FormatInt(EpochLockTimeout.Milliseconds(), 10)

// DroppedEpoch is an epoch whose partition DropExpiredEpochs dropped.
type DroppedEpoch struct {
	Epoch int32
	// Records is how many records the partition held.
	Records int64
	// Locked is how long processed_messages was locked against claims: from the detach,
	// its wait for the claims in flight included (new ones queue behind it), to the commit
	// (its WAL flush aside). PostgreSQL releases the lock before it removes the
	// partition's files, which takes longer with its size: that is not counted, and claims
	// do not wait for it.
	Locked time.Duration
}

// epochLockKey is the advisory lock of the epochs of schema: claims take it shared,
// OpenEpoch exclusive.
func epochLockKey(schema string) int64 {
	h := fnv.New64a()
	h.Write([]byte("idemd.epochs:" + schema))
	return int64(h.Sum64())
}

// partition is the quoted name of epoch's partition.
func (s *Store) partition(epoch int32) string {
	return pgx.Identifier{s.schema, "processed_messages_e" + strconv.Itoa(int(epoch))}.Sanitize()
}

func (s *Store) table(name string) string { return pgx.Identifier{s.schema, name}.Sanitize() }

// CurrentEpoch returns the epoch that new records go to.
func (s *Store) CurrentEpoch(ctx context.Context, pool *pgxpool.Pool) (int32, error) {
	var epoch int32
	if err := pool.QueryRow(ctx, `SELECT max(epoch) FROM `+s.table("processed_epochs")).Scan(&epoch); err != nil {
		return 0, fmt.Errorf("error reading the current epoch: %w", err)
	}
	return epoch, nil
}

// Epochs returns how many epochs (partitions) processed_messages has.
func (s *Store) Epochs(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+s.table("processed_epochs")).Scan(&n); err != nil {
		return 0, fmt.Errorf("error counting epochs: %w", err)
	}
	return n, nil
}

// OpenEpoch opens the next epoch when the current one opened at least interval ago (at
// once when interval is 0): it creates the next partition and makes it the current one.
// It returns the epoch opened, or 0 when none was due. Several pruners may call it at once:
// one opens the epoch, the others find it opened.
func (s *Store) OpenEpoch(ctx context.Context, pool *pgxpool.Pool, interval time.Duration) (int32, error) {
	epochs := s.table("processed_epochs")
	due := `SELECT epoch, opened_at <= now() - $1::bigint * interval '1 microsecond' FROM ` + epochs + ` ORDER BY epoch DESC LIMIT 1`
	var (
		current int32
		isDue   bool
	)
	if err := pool.QueryRow(ctx, due, interval.Microseconds()).Scan(&current, &isDue); err != nil {
		return 0, fmt.Errorf("error reading the current epoch: %w", err)
	}
	if !isDue {
		return 0, nil
	}
	var opened int32
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, setLockTimeout); err != nil {
			return err
		}
		// Waits for the claims in flight; new ones wait for this transaction.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, epochLockKey(s.schema)); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, due, interval.Microseconds()).Scan(&current, &isDue); err != nil || !isDue {
			return err
		}
		next := current + 1
		part := s.partition(next)
		// ATTACH, unlike CREATE TABLE … PARTITION OF, does not lock out the claims' reads and
		// writes of processed_messages; the partition is empty, so it has nothing to check.
		for _, q := range []string{
			`CREATE TABLE ` + part + ` (LIKE ` + s.table("processed_messages") + ` INCLUDING ALL) WITH (autovacuum_vacuum_scale_factor = 0.02)`,
			`ALTER TABLE ` + s.table("processed_messages") + ` ATTACH PARTITION ` + part + ` FOR VALUES FROM (` + strconv.Itoa(int(next)) + `) TO (` + strconv.Itoa(int(next)+1) + `)`,
		} {
			if _, err := tx.Exec(ctx, q); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+epochs+` (epoch) VALUES ($1)`, next); err != nil {
			return err
		}
		opened = next
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("error opening epoch %d: %w", current+1, err)
	}
	return opened, nil
}

// DropExpiredEpochs drops the partition of every epoch before the current one whose
// records have all expired, and in which no reservation holds a live lease.
func (s *Store) DropExpiredEpochs(ctx context.Context, pool *pgxpool.Pool) ([]DroppedEpoch, error) {
	rows, err := pool.Query(ctx, `SELECT epoch FROM `+s.table("processed_epochs")+` WHERE epoch < (SELECT max(epoch) FROM `+s.table("processed_epochs")+`) ORDER BY epoch`)
	if err != nil {
		return nil, fmt.Errorf("error listing epochs: %w", err)
	}
	old, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, fmt.Errorf("error listing epochs: %w", err)
	}
	var dropped []DroppedEpoch
	for _, epoch := range old {
		d, ok, err := s.dropEpoch(ctx, pool, epoch)
		if err != nil {
			return dropped, err
		}
		if ok {
			dropped = append(dropped, d)
		}
	}
	return dropped, nil
}

// dropEpoch drops epoch's partition if every record in it has expired. The checks read
// the partition before the lock is taken (the expiry by the expires_at index, the leases by
// a scan only once the records have expired), since nothing moves a record's expiry or
// lease forward in an older epoch: a record taken over moves to the current one.
func (s *Store) dropEpoch(ctx context.Context, pool *pgxpool.Pool, epoch int32) (DroppedEpoch, bool, error) {
	part := s.partition(epoch)
	var expired bool
	err := poolByIndex(ctx, pool, func(b *pgx.Batch) {
		b.Queue(`SELECT coalesce(max(expires_at) <= now(), true) FROM ` + part).QueryRow(func(row pgx.Row) error { return row.Scan(&expired) })
	})
	if err != nil || !expired {
		return DroppedEpoch{}, false, wrapEpochErr(epoch, err)
	}
	var leased bool
	var records int64
	err = pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'in_flight' AND lease_until > now()) > 0, count(*) FROM `+part).Scan(&leased, &records)
	if err != nil || leased {
		return DroppedEpoch{}, false, wrapEpochErr(epoch, err)
	}
	var locked time.Duration
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// DETACH locks processed_messages against every reader and writer: it waits for the
		// transactions in flight, and new ones wait for it.
		if _, err := tx.Exec(ctx, setLockTimeout); err != nil {
			return err
		}
		began := time.Now()
		defer func() { locked = time.Since(began) }()
		for _, q := range []string{
			`ALTER TABLE ` + s.table("processed_messages") + ` DETACH PARTITION ` + part,
			`DROP TABLE ` + part,
		} {
			if _, err := tx.Exec(ctx, q); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `DELETE FROM `+s.table("processed_epochs")+` WHERE epoch = $1`, epoch)
		return err
	})
	if err != nil {
		return DroppedEpoch{}, false, wrapEpochErr(epoch, err)
	}
	return DroppedEpoch{Epoch: epoch, Records: records, Locked: locked}, true, nil
}

func wrapEpochErr(epoch int32, err error) error {
	if err == nil || goneEpoch(err) {
		return nil
	}
	return fmt.Errorf("error dropping epoch %d: %w", epoch, err)
}

// goneEpoch reports whether err says that an epoch's partition does not exist (any more):
// another pruner (each replica runs one) dropped it after this one listed the epochs.
func goneEpoch(err error) bool {
	return pgerr.Code(err) == "42P01" // undefined_table
}

// EpochRound is what one PruneEpochs did.
type EpochRound struct {
	// Opened is the epoch opened, 0 when none was due.
	Opened int32
	// Dropped are the epochs dropped, in order.
	Dropped []DroppedEpoch
	// Deleted is how many records PruneOutlived deleted row by row.
	Deleted int64
}

// Records is how many records the round removed: the dropped epochs' and the deleted ones.
func (r EpochRound) Records() int64 {
	n := r.Deleted
	for _, d := range r.Dropped {
		n += d.Records
	}
	return n
}

// PruneEpochs is a pruning round with epochs opened every interval: it opens the next
// epoch when due (OpenEpoch), drops the expired ones (DropExpiredEpochs), deletes the
// records that the epochs left would keep more than one span past their retention
// (PruneOutlived: with mixed retentions) and deletes expired conflicts (PruneConflicts).
// Deletes go in batches of at most batchSize. Each step runs even when one before it
// failed; the errors are joined.
func (s *Store) PruneEpochs(ctx context.Context, pool *pgxpool.Pool, interval time.Duration, batchSize int) (EpochRound, error) {
	var round EpochRound
	var errOpen, errDrop, errOutlived error
	round.Opened, errOpen = s.OpenEpoch(ctx, pool, interval)
	round.Dropped, errDrop = s.DropExpiredEpochs(ctx, pool)
	round.Deleted, errOutlived = s.PruneOutlived(ctx, pool, batchSize)
	return round, errors.Join(errOpen, errDrop, errOutlived, s.PruneConflicts(ctx, pool, batchSize))
}

// EpochsPerRetention is how many epochs the default interval makes of the longest
// retention (IDEMD_PROCESSED_PARTITION_INTERVAL=auto): the interval is the longest
// retention itself, so two epochs are live (three while the oldest waits for its last
// record's expiry), and a new id is looked up in one or two older partitions. Each older
// epoch costs a new id a primary-key lookup, unless an EpochFilter spares it: with a
// quarter of the retention (five or six live epochs, the default of phase 27), the
// consumer lost a quarter of its rate on a million records and two fifths on ten million;
// with two epochs, 6-19 % on a million (BENCHMARKS.md, phases 28 and 29). The price is
// storage: a record stays up to one interval past its retention, half of one on average.
const EpochsPerRetention = 1

package outbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/internal/pgerr"
)

// The relay's floor. Rows deleted at publish leave their primary-key entries behind until a
// VACUUM removes them, at the head of the index, since ids grow. A statement that looks for
// the lowest unpublished rows — a round's read of the table, the check for older rows below
// handed ones — starts at the head and steps over every one of those entries: between two
// autovacuum runs a minute apart, at 30,000 events/s, that is up to 1.8 million entries, a
// few milliseconds per statement and many statements per second (BENCHMARKS.md, phases 18
// and 19). Bounding them by id is not possible from what the relay saw alone, since a
// transaction that took its id long ago may still commit: that is what they look for.
//
// The floor is an id below which no row is unpublished, now or ever: the statements start
// at it. It is raised with a fence, as CREATE INDEX CONCURRENTLY waits for the transactions
// before it:
//
//  1. Opening: the last id the outbox's identity gave (last), then the virtual transaction
//     ids of every transaction running in the database (pg_locks; autovacuum's workers
//     left out, as CREATE INDEX CONCURRENTLY leaves them), in that order. Any row with an
//     id up to last belongs to a transaction that had begun when its id was taken, so
//     before last was read: it had committed or rolled back by then, or it is one of those
//     running.
//  2. Closing, at a later step (RelayConfig.FloorInterval): once none of them runs any
//     more (and no prepared transaction waits in the database: it would have left
//     pg_locks at PREPARE), no row with an id up to last can still appear. The lowest
//     unpublished id between the floor and last, if any, is the new floor (a row of a
//     destination waiting for its retry, or one not published yet); else last + 1.
//
// The next fence opens as one closes. A long transaction in the database holds the fence
// open, and the floor stays where it is: the statements then walk as they did without it.
// It relies on the identity giving ids in order, as it does without a cache (migration
// 0001; a session caching ids could give one below last after the fence), and it notices
// an identity that went back (TRUNCATE … RESTART IDENTITY). Every relayFloorRecheckEvery
// fences, the closing looks from the bottom of the index instead of the floor, and lowers
// the floor, with an error logged, if it finds an unpublished row below it: a row
// published late, out of its order, rather than never.
type floorFence struct {
	last    int64    // the last id given when the fence opened
	running []string // the virtual transaction ids running then
}

// relayFloorRecheckEvery: every so many fences, one closes from the bottom of the index.
const relayFloorRecheckEvery = 256

// moveFloor closes the open fence if it can, and opens the next (see floorFence). An error
// leaves the floor where it is, which is always safe: the first of a streak is logged as a
// warning, the others at debug level. A role that may not read the outbox's identity
// (USAGE or SELECT on its sequence) leaves the floor at the bottom for good, said once.
func (r *Relay) moveFloor(ctx context.Context) {
	if r.floorOff {
		return
	}
	err := r.stepFence(ctx)
	switch {
	case err == nil:
		r.floorFailing = false
		return
	case ctx.Err() != nil:
		return
	}
	r.fence = nil
	if pgerr.Code(err) == "42501" { // insufficient_privilege
		r.floorOff = true
		r.log.WithError(err).Warn("the relay may not read the outbox's identity: its reads start from the bottom of the outbox (see the README, Long transactions and vacuum)")
		return
	}
	if r.floorFailing {
		r.log.WithError(err).Debug("error moving the outbox floor; it stays where it is")
		return
	}
	r.floorFailing = true
	r.log.WithError(err).Warn("error moving the outbox floor; it stays where it is")
}

// stepFence closes the open fence if it can, and opens the next one when none is left open.
func (r *Relay) stepFence(ctx context.Context) error {
	if f := r.fence; f != nil {
		closed, err := r.closeFence(ctx, f)
		if err != nil || !closed {
			return err
		}
		r.fence = nil
	}
	return r.openFence(ctx)
}

// openFence opens a fence: the last id given, then the transactions running.
func (r *Relay) openFence(ctx context.Context) error {
	f := &floorFence{}
	b := &pgx.Batch{}
	b.Queue(r.lastIDSQL, r.table).QueryRow(func(row pgx.Row) error { return row.Scan(&f.last) })
	b.Queue(runningSQL).QueryRow(func(row pgx.Row) error { return row.Scan(&f.running) })
	if err := r.pool.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("opening a fence: %w", err)
	}
	if f.last+1 < r.floor {
		// The identity went back (TRUNCATE … RESTART IDENTITY): start from the bottom.
		r.log.WithField("floor", r.floor).WithField("last_id", f.last).Warn("the outbox's ids went back: the relay's floor starts again from the bottom")
		r.setFloor(0)
		// Nor are the ids the relay deleted lately known to be free of unpublished rows:
		// they are given again.
		r.recent = r.recent[:0]
	}
	r.fence = f
	return nil
}

// closeFence raises the floor if no transaction of f still runs, and reports whether it did.
func (r *Relay) closeFence(ctx context.Context, f *floorFence) (bool, error) {
	var waiting bool
	if err := r.pool.QueryRow(ctx, stillRunningSQL, f.running).Scan(&waiting); err != nil {
		return false, fmt.Errorf("closing a fence: %w", err)
	}
	if waiting {
		return false, nil
	}
	r.fences++
	from := r.floor
	if r.fences%relayFloorRecheckEvery == 0 {
		from = 0
	}
	var lowest *int64
	if err := queryRowByIndex(ctx, r.pool, r.lowestSQL, []any{from, f.last}, &lowest); err != nil {
		return false, fmt.Errorf("closing a fence: %w", err)
	}
	next := f.last + 1
	if lowest != nil {
		next = *lowest
	}
	if next < r.floor {
		r.log.WithField("floor", r.floor).WithField("outbox_id", next).Error("an unpublished outbox row is below the relay's floor: it is published now, possibly after rows written after it; please report this")
	}
	r.setFloor(next)
	return true, nil
}

func (r *Relay) setFloor(id int64) {
	r.floor = id
	r.floorValue.Store(id)
}

const (
	// runningSQL: the virtual transaction ids of the transactions running in the database,
	// but the one asking's. As CREATE INDEX CONCURRENTLY does, it leaves out the other
	// databases' sessions and autovacuum's workers, which write no outbox row: an
	// autovacuum of a large table runs for minutes, and would hold the floor all along.
	// A role that may not see other roles' sessions (neither superuser nor member of
	// pg_read_all_stats) sees their database but not their backend_type: such a session
	// counts, autovacuum's workers included.
	runningSQL = `SELECT coalesce(array_agg(l.virtualxid), '{}') FROM pg_locks l
JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'virtualxid' AND l.mode = 'ExclusiveLock' AND l.granted AND l.pid <> pg_backend_pid()
  AND a.datname = current_database() AND a.backend_type IS DISTINCT FROM 'autovacuum worker'`
	// stillRunningSQL: whether one of them ($1) still runs, or a prepared transaction
	// waits in the database.
	stillRunningSQL = `SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'virtualxid' AND mode = 'ExclusiveLock' AND granted AND virtualxid = ANY($1::text[]))
    OR EXISTS (SELECT FROM pg_prepared_xacts WHERE database = current_database())`
)

// floorSQL are the relay's statements for its floor, on the outbox table (quoted); lastID
// takes the table's name as $1. pg_sequence_last_value is NULL until the identity gave its
// first id.
func floorSQL(table string) (lastID, lowest string) {
	return `SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence($1, 'id')::regclass), 0)`,
		`SELECT min(id) FROM ` + table + ` WHERE published_at IS NULL AND id >= $1 AND id <= $2`
}

package main

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/pgerr"
)

// PostgreSQL's work per message, counted rather than timed: the WAL the server wrote, its
// records and full-page images, the shared buffers its backends touched and the rows they
// wrote. On a shared machine the rates and even the CPU per message move from run to run
// (phase 15 saw the same build's consumer move by 1.9×); these counts move only with what
// the statements do, so they tell whether a change made PostgreSQL do less, with one run.
//
// They are the server's (the WAL) and the bench database's (buffers, rows) counters, read
// when a load starts and again once its connections have closed (a backend reports its
// counters at the latest when it exits), so nothing else may write to the server meanwhile:
// the bench's own reads between the two (offsets, sizes) touch a few buffers and write no
// WAL. Full-page images depend on when the last checkpoint was (the first change of a page
// after one writes the whole page), so WAL bytes are the noisier of the counts; WAL records
// and buffers are not.

// PGWork is PostgreSQL's work per message over one load.
type PGWork struct {
	WALBytes   float64 `json:"wal_bytes_per_msg"`
	WALRecords float64 `json:"wal_records_per_msg"`
	WALFPI     float64 `json:"wal_fpi_per_msg"`
	// Buffers are the shared buffers read or found in cache (pg_stat_database's blks_read +
	// blks_hit): each is a lookup, a pin and a lock of one page.
	Buffers float64 `json:"buffers_per_msg"`
	// Read are those of Buffers that were not in shared buffers (pg_stat_database's
	// blks_read): each read from the kernel's page cache or the disk, and a buffer found
	// for it, often by writing out another (since phase 34).
	Read float64 `json:"buffers_read_per_msg"`
	// RowsWritten are the rows inserted, updated and deleted.
	RowsWritten float64 `json:"rows_written_per_msg"`
}

// pgCounters are the server's and the database's counters at one moment.
type pgCounters struct {
	lsn                             string
	walRecords, walFPI, walBytes    int64
	buffers, inserted, upd, deleted int64
	read                            int64
}

const pgCountersSQL = `SELECT pg_current_wal_lsn()::text, w.wal_records, w.wal_fpi, w.wal_bytes::bigint,
       d.blks_read + d.blks_hit, d.tup_inserted, d.tup_updated, d.tup_deleted, d.blks_read
FROM pg_stat_wal w, pg_stat_database d WHERE d.datname = current_database()`

// pgCountersNow reads the counters, or returns nil when the server does not have them
// (pg_stat_wal is PostgreSQL 14's).
func (e *env) pgCountersNow(ctx context.Context) *pgCounters {
	var c pgCounters
	err := e.pool.QueryRow(ctx, pgCountersSQL).Scan(&c.lsn, &c.walRecords, &c.walFPI, &c.walBytes,
		&c.buffers, &c.inserted, &c.upd, &c.deleted, &c.read)
	if err != nil {
		e.logf("PostgreSQL's counters not read (%v): no work per message", err)
		return nil
	}
	return &c
}

// waitBackendsGone waits (up to 5 s) until no backend with application_name app is left,
// so that their counters have been reported.
func (e *env) waitBackendsGone(ctx context.Context, app string) {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		var n int
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n); err != nil || n == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// pgCountersAfter waits until the backends of app are gone, so that they have reported
// their counters, and reads the counters.
func (e *env) pgCountersAfter(ctx context.Context, app string) *pgCounters {
	e.waitBackendsGone(ctx, app)
	return e.pgCountersNow(ctx)
}

// pgWorkSince is the work per message from start to now, once the backends of app are
// gone; nil when a count is missing.
func (e *env) pgWorkSince(ctx context.Context, start *pgCounters, app string, messages int) *PGWork {
	if start == nil {
		return nil
	}
	return start.workTo(e.pgCountersAfter(ctx, app), messages)
}

// workTo is the work per message from c to end; nil when either is missing.
func (c *pgCounters) workTo(end *pgCounters, messages int) *PGWork {
	if c == nil || end == nil || messages <= 0 {
		return nil
	}
	a, ok1 := parseLSN(c.lsn)
	b, ok2 := parseLSN(end.lsn)
	if !ok1 || !ok2 {
		return nil
	}
	n := float64(messages)
	return &PGWork{
		WALBytes:    float64(b-a) / n,
		WALRecords:  float64(end.walRecords-c.walRecords) / n,
		WALFPI:      float64(end.walFPI-c.walFPI) / n,
		Buffers:     float64(end.buffers-c.buffers) / n,
		Read:        float64(end.read-c.read) / n,
		RowsWritten: float64(end.inserted-c.inserted+end.upd-c.upd+end.deleted-c.deleted) / n,
	}
}

// parseLSN reads a pg_lsn's text form, two hexadecimal halves: "16/B374D848".
func parseLSN(s string) (uint64, bool) {
	hi, lo, ok := strings.Cut(s, "/")
	if !ok {
		return 0, false
	}
	h, err1 := strconv.ParseUint(hi, 16, 32)
	l, err2 := strconv.ParseUint(lo, 16, 32)
	return h<<32 | l, err1 == nil && err2 == nil
}

// String is the work's columns in the work table (tab-separated).
func (w *PGWork) String() string {
	if w == nil {
		return "-\t-\t-\t-\t-\t-"
	}
	f := func(v float64, prec int) string { return strconv.FormatFloat(v, 'f', prec, 64) }
	return strings.Join([]string{f(w.WALBytes, 0), f(w.WALRecords, 2), f(w.WALFPI, 3), f(w.Buffers, 1), f(w.Read, 2), f(w.RowsWritten, 2)}, "\t")
}

// reportCounters makes the backend of each of conns report its counters now. PostgreSQL 15
// reports a backend's at most once a second when it goes idle, so the work of a statement
// that ended just before a load was counted in the load (phase 34: the growth section's
// deletes between runs, 0.8 rows a message, and the consumer child's build of its filter
// before it said ready, 0.2 buffers read a message at 1 M rows). Before PostgreSQL 15
// (no pg_stat_force_next_flush) it does nothing.
func reportCounters(ctx context.Context, conns ...*pgxpool.Conn) error {
	for _, c := range conns {
		if _, err := c.Exec(ctx, "SELECT pg_stat_force_next_flush()"); err != nil {
			if pgerr.Code(err) == "42883" { // undefined_function: before PostgreSQL 15
				return nil
			}
			return err
		}
	}
	return nil
}

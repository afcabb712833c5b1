package outbox

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/internal/pgarray"
)

// Handoff passes the outbox rows that a process committed to the relay of the same
// process, so that a leading relay publishes them without reading them back from the table.
// Give the same Handoff to the Store that writes the rows (Config.Handoff; the unit of work
// takes it from exactlyonce.Config) and to the relay (RelayConfig.Handoff). It changes what
// the relay reads, never what it guarantees:
//
//   - A row is written to the outbox in its transaction as always. Only once that
//     transaction committed is it handed over; a process that dies before leaves it in the
//     table, where the next leader finds it.
//   - The relay takes the handed rows only while it is caught up: its last read of the table
//     left nothing behind, no destination waits for a retry, no Drain waits, and less than
//     RelayConfig.PollInterval passed since it last read the table. Otherwise it reads the
//     table, which holds every row still to publish, handed or not.
//   - It publishes handed rows in one transaction that first deletes them (or, with
//     KeepPublished, marks them) and looks for the other unpublished rows below and
//     between them (committed by another process, or not handed over yet): those it finds
//     by id it takes in the same transaction and publishes with them, in id order; when it
//     has to walk the primary key instead, or the rows found would overfill the round, it
//     rolls back and reads the table, so that rows of one key written one after another
//     keep their order either way. The deletion commits only after every broker
//     acknowledged the rows; a crash before leaves them in the table, to be published
//     again with the same operation id.
//   - A row the relay published from the table before its handed copy came up is deleted
//     already: the handed copy is dropped, not published twice.
//
// While no relay of the process leads, the Store asks for no ids and the writer wakes the
// relay with a NOTIFY, as without a Handoff. A Handoff holds at most four rounds of rows
// (4 × RelayConfig.BatchSize rows, and 4 MB of events whatever their size); beyond that the
// writer wakes the relay with a NOTIFY as well and the relay reads the table until it
// caught up.
type Handoff struct {
	mu       sync.Mutex
	leading  bool
	wake     func()
	max      int // rows
	maxBytes int // eventSize summed over rows
	bytes    int
	rows     []handedRow
	// spare is the array of rows a round took and gave back (recycle), for the rows handed
	// next: a round that takes every waiting row takes rows' array itself.
	spare []handedRow
	// overflow: rows were turned away since the relay last took some; it reads the table.
	overflow bool
	// overflows counts the times rows were first turned away (tests, the bench).
	overflows int64
}

// handedRow is one committed outbox row: its id and its event as the relay would read it
// back (Topic the destination column).
type handedRow struct {
	id int64
	e  Event
}

// NewHandoff returns a Handoff that no relay uses yet.
func NewHandoff() *Handoff { return &Handoff{} }

// Handed is the rows one transaction wrote through a Store with a Handoff, whose ids are
// filled in when the transaction's batch runs. Pass it to Store.HandOver once the
// transaction committed.
type Handed struct {
	events []Event
	ids    []int64
}

// scanIDs reads the ids the outbox insert returned.
func (h *Handed) scanIDs(rows pgx.Rows) error {
	var id int64
	for rows.Next() {
		if err := rows.Scan(&id); err != nil {
			return err
		}
		h.ids = append(h.ids, id)
	}
	return rows.Err()
}

// leadingNow reports whether a relay of the process leads: whether a Store should ask for
// the ids of its rows.
func (h *Handoff) leadingNow() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.leading
}

// hand queues the committed rows of hs for the relay and wakes it. It returns false, and
// queues nothing, when no relay of the process leads, when an entry lacks its ids (its
// statement's result was not read), or when the relay is too far behind.
func (h *Handoff) hand(hs []*Handed) bool {
	n, bytes := 0, 0
	for _, x := range hs {
		if len(x.ids) != len(x.events) {
			return false
		}
		n += len(x.ids)
		for i := range x.events {
			bytes += eventSize(&x.events[i])
		}
	}
	h.mu.Lock()
	if !h.leading {
		h.mu.Unlock()
		return false
	}
	if len(h.rows)+n > h.max || (h.bytes+bytes > h.maxBytes && len(h.rows) > 0) {
		if !h.overflow {
			h.overflows++
		}
		h.overflow = true
		h.mu.Unlock()
		return false
	}
	for _, x := range hs {
		for i, id := range x.ids {
			h.rows = append(h.rows, handedRow{id: id, e: x.events[i]})
		}
	}
	h.bytes += bytes
	wake := h.wake
	h.mu.Unlock()
	wake()
	return true
}

// attach makes the relay that calls it, which has just taken the leadership, the receiver
// of handed rows; wake wakes it.
func (h *Handoff) attach(wake func(), maxRows, maxBytes int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.leading, h.wake, h.max, h.maxBytes = true, wake, maxRows, maxBytes
	h.rows, h.bytes, h.overflow = nil, 0, false
}

// detach is called when the relay stops leading: the rows waiting are forgotten (they are
// in the table, for the next leader).
func (h *Handoff) detach() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.leading, h.wake = false, nil
	h.rows, h.bytes, h.overflow = nil, 0, false
}

// take returns up to maxRows handed rows within maxBytes (at least one row), in id order.
// They are the caller's until it gives their array back with recycle.
// After an overflow it forgets every waiting row and reports it: the relay then reads the
// table, where those rows are.
func (h *Handoff) take(maxRows, maxBytes int) (rows []handedRow, overflow bool) {
	rows, overflow = h.takeUnsorted(maxRows, maxBytes)
	// Sorted once they are the caller's, so that the writers handing rows meanwhile do not
	// wait for it.
	slices.SortFunc(rows, func(a, b handedRow) int { return cmp.Compare(a.id, b.id) })
	return rows, overflow
}

// takeUnsorted is take, the rows in the order they were handed.
func (h *Handoff) takeUnsorted(maxRows, maxBytes int) (rows []handedRow, overflow bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.overflow {
		h.rows, h.bytes, h.overflow = nil, 0, false
		return nil, true
	}
	n, bytes := 0, 0
	for n < len(h.rows) && n < maxRows {
		size := eventSize(&h.rows[n].e)
		if bytes+size > maxBytes && n > 0 {
			break
		}
		bytes += size
		n++
	}
	if n == 0 {
		return nil, false
	}
	if n == len(h.rows) {
		// Every row waiting, as under steady load: the array itself, none copied.
		rows, h.rows, h.spare = h.rows, h.spare, nil
	} else {
		rows = slices.Clone(h.rows[:n])
		h.rows = slices.Delete(h.rows, 0, n)
	}
	h.bytes -= bytes
	return rows, false
}

// recycle gives back the array of rows a round took, once the round is done with them (a
// putBack copies them), for the rows handed next. It is emptied first, so that it pins no
// event; a large one is left to the collector.
func (h *Handoff) recycle(rows []handedRow) {
	if cap(rows) > relayHandoffRounds*RelayBatchSizeDefault {
		return
	}
	clear(rows)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.spare == nil {
		h.spare = rows[:0]
	}
}

// putBack returns rows taken and not published to the head of the queue.
func (h *Handoff) putBack(rows []handedRow) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.leading && !h.overflow {
		h.rows = slices.Insert(h.rows, 0, rows...)
		for i := range rows {
			h.bytes += eventSize(&rows[i].e)
		}
	}
}

// reached reports whether rows wait and the smallest of their ids is at most id.
func (h *Handoff) reached(id int64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.rows) == 0 {
		return false
	}
	least := h.rows[0].id
	for _, row := range h.rows[1:] {
		least = min(least, row.id)
	}
	return least <= id
}

// waiting returns the ids of the rows handed over and not yet taken, sorted.
func (h *Handoff) waiting() []int64 {
	h.mu.Lock()
	ids := make([]int64, len(h.rows))
	for i := range h.rows {
		ids[i] = h.rows[i].id
	}
	h.mu.Unlock()
	slices.Sort(ids)
	return ids
}

// gapsBetween returns the ids between the first and the last of ids (sorted) that are
// neither in ids nor in any of skip, or ok false when there are more than limit of them.
// Each of skip is sorted here unless it already is (Handoff.waiting sorts its ids, and
// Relay.remember keeps its own sorted). The ids looked at only go up, so each skip list is
// walked once beside them, from the first of its ids above ids[0], rather than searched
// for each id: the range below the first handed id (holesBelow) spans thousands of ids
// under load, and a search each was a third of the leading relay's CPU (BENCHMARKS.md,
// phase 33).
func gapsBetween(ids []int64, limit int, skip ...[]int64) (gaps []int64, ok bool) {
	skipped := 0
	for i, s := range skip {
		skipped += len(s)
		if !slices.IsSorted(s) {
			skip[i] = slices.Sorted(slices.Values(s))
		}
	}
	if n := ids[len(ids)-1] - ids[0] + 1 - int64(len(ids)); n == 0 {
		return nil, true
	} else if n > int64(limit)+int64(skipped) {
		return nil, false
	}
	at := make([]int, len(skip)) // in skip[k], the first id not below the id looked at
	for k, s := range skip {
		at[k], _ = slices.BinarySearch(s, ids[0]+1)
	}
	for i := 1; i < len(ids); i++ {
	between:
		for id := ids[i-1] + 1; id < ids[i]; id++ {
			for k, s := range skip {
				for at[k] < len(s) && s[at[k]] < id {
					at[k]++
				}
				if at[k] < len(s) && s[at[k]] == id {
					continue between
				}
			}
			if gaps = append(gaps, id); len(gaps) > limit {
				return nil, false
			}
		}
	}
	return gaps, true
}

// holesBelow returns the ids from floor up to first (excluded) that are not in recent
// (sorted), or ok false when there are more than limit of them. recent are ids of rows
// the relay deleted for good, and ids are never used twice: an unpublished row below first
// and at or above the floor can only have one of the ids returned.
func holesBelow(floor, first int64, limit int, recent []int64) (holes []int64, ok bool) {
	if floor >= first {
		return nil, true
	}
	// The ids strictly between floor-1 and first, as gapsBetween counts them.
	return gapsBetween([]int64{floor - 1, first}, limit, recent)
}

// relayHandoffRounds is how many rounds of rows (BatchSize each) a Handoff holds for its
// relay at most.
const relayHandoffRounds = 4

// takeHanded returns the next handed rows to publish (none: the wake was for rows an
// earlier round took), or ok false when the round must read the table: the relay is not
// caught up (selectDue: it also follows a NOTIFY and the poll), reads ahead, holds a
// destination back, a Drain waits, or the poll interval passed since it last read the table.
func (r *Relay) takeHanded() (rows []handedRow, ok bool) {
	h := r.cfg.Handoff
	if h == nil || r.selectDue || r.next != nil || len(r.failing) > 0 ||
		time.Since(r.lastSelect) >= r.cfg.PollInterval || r.draining() {
		return nil, false
	}
	rows, overflow := h.take(r.cfg.BatchSize, relayRoundBytes)
	if overflow {
		// Rows were turned away: they are in the table, read it until caught up.
		r.selectDue = true
		return nil, false
	}
	return rows, true
}

// publishHanded publishes rows handed over by this process (rows, in id order). One
// transaction deletes (or marks) them, keeping those still unpublished (the others were
// published from the table already), and looks for the unpublished rows left below and
// between them. Found by their ids (the holes the relay did not delete itself), they are
// taken in the same transaction and published with them in id order; found by a walk of
// the primary key, or too many for one round, they make it roll back, and the next round
// reads the table, which holds them and these in id order. Otherwise it publishes the rows
// and commits once every broker acknowledged them. When a publish fails it rolls back and
// settles the rows as a round read from the table does (the destination waits for its
// retry, refused rows are dead-lettered).
func (r *Relay) publishHanded(ctx context.Context, rows []handedRow) (*round, error) {
	rd := &round{FromHandoff: true}
	ids := make([]int64, len(rows))
	for i := range rows {
		ids[i] = rows[i].id
	}
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		return rd, fmt.Errorf("error taking %d handed outbox rows: %w", len(ids), err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit, or when the rows stay
	var (
		taken = make([]int64, 0, len(ids))
		older bool
		// olderRows are the unpublished rows the check found by id below or between these,
		// taken in the same transaction to be published with them.
		olderRows []handedRow
		b         pgx.Batch
	)
	b.Queue(byIndex) // local to tx: see relay_read.go
	takeSQL, takeArgs := r.take.forIDs(ids)
	b.Queue(takeSQL, takeArgs...).Query(func(rs pgx.Rows) error {
		var id int64
		for rs.Next() {
			if err := rs.Scan(&id); err != nil {
				return err
			}
			taken = append(taken, id)
		}
		return rs.Err()
	})
	// The rows still waiting in the Handoff were handed over after these (it hands them out
	// in order), and a writer hands its rows over before it acknowledges anything: none of
	// them was committed before one of these began, so they are not looked for.
	waiting := r.cfg.Handoff.waiting()
	// Nor are the rows this relay deleted (or moved) lately: ids are never used twice, so
	// none of theirs is an unpublished row. Most ids between a transaction's rows are those
	// of other transactions, written at the same time and published by the rounds before.
	limit := relayHandoffRounds * r.cfg.BatchSize
	if gaps, ok := gapsBetween(ids, limit, waiting, r.recent); ok {
		// The ids between them: an index probe each, rather than a walk over the entries of
		// the rows just deleted (each a visit to the heap until a scan has marked them dead).
		r.gapProbes.Add(int64(len(gaps)))
		if below, ok := holesBelow(r.floor, ids[0], limit-len(gaps), r.recent); ok {
			// Below the first id too: the floor's range less the ids this relay deleted is
			// the holes, of rows in flight or of other processes. With none, nothing is
			// left to look for.
			r.belowProbes.Add(int64(len(below)))
			if probes := append(below, gaps...); len(probes) > 0 {
				// These probes cover every id an older unpublished row can have: the rows
				// found are all of them, and are published in this round, in id order
				// with these, rather than read back from the table by the next.
				b.Queue(r.takeOlderSQL, pgarray.Int8(probes)).Query(func(rs pgx.Rows) error {
					var sc rowScanner
					for rs.Next() {
						id, topic, e, err := sc.scan(rs)
						if err != nil {
							return fmt.Errorf("error reading outbox: %w", err)
						}
						e.Topic = topic // a handed row's Topic is its destination column
						olderRows = append(olderRows, handedRow{id: id, e: e})
					}
					return rs.Err()
				})
			}
		} else {
			r.belowWalks.Add(1)
			b.Queue(r.olderGapsSQL, ids[0], pgarray.Int8(gaps), r.floor).QueryRow(func(row pgx.Row) error { return row.Scan(&older) })
		}
	} else {
		r.belowWalks.Add(1)
		b.Queue(r.olderSQL, ids[len(ids)-1], pgarray.Int8(waiting), r.floor).QueryRow(func(row pgx.Row) error { return row.Scan(&older) })
	}
	if err := tx.SendBatch(ctx, &b).Close(); err != nil {
		return rd, fmt.Errorf("error taking %d handed outbox rows: %w", len(ids), err)
	}
	slices.Sort(taken)
	round := rows // every row taken and none older, as under steady load: no copy
	if len(taken) < len(rows) || len(olderRows) > 0 {
		round = make([]handedRow, 0, len(taken)+len(olderRows))
		for _, row := range rows {
			if _, found := slices.BinarySearch(taken, row.id); found {
				round = append(round, row)
			}
		}
	}
	if len(olderRows) > 0 {
		round = append(round, olderRows...)
		slices.SortFunc(round, func(a, b handedRow) int { return cmp.Compare(a.id, b.id) })
		// A round goes to each partition in one produce request (relay_writer.go): with the
		// older rows it may no longer fit in one, and the table is read instead, as after
		// a walk that found an older row (kept here, though only probes return rows).
		older = older || len(round) > r.cfg.BatchSize || roundBytes(round) > relayRoundBytes
	}
	if older {
		r.fallbacks.Add(1)
		// A row below these was committed without being handed over (by another process, or
		// a writer without the Handoff) and the check could not take it: the next round
		// reads the table, which publishes it first. These rows wait for it, in the Handoff
		// still; the transaction, which may have taken rows, rolls back.
		r.cfg.Handoff.putBack(rows)
		r.selectDue, rd.More = true, true
		return rd, nil
	}
	if len(round) == 0 {
		return rd, nil
	}
	taken = taken[:0]
	var g grouping
	for _, row := range round {
		taken = append(taken, row.id)
		g.add(r, row.e.Topic, row.id, row.e, len(round))
	}
	r.sendAll(ctx, g.batches)
	for _, b := range g.batches {
		for _, e := range b.errs {
			if e != nil || ctx.Err() != nil {
				// The rows not published stay: settle them as a round read from the table.
				if err := tx.Rollback(context.WithoutCancel(ctx)); err != nil {
					return rd, fmt.Errorf("error returning handed outbox rows: %w", err)
				}
				return r.finish(ctx, g.batches, rd)
			}
		}
	}
	if r.cfg.AfterPublish != nil {
		if err := r.cfg.AfterPublish(taken); err != nil {
			return rd, hookError{err}
		}
	}
	// The brokers have them: committed even if ctx is ending, or they would be sent twice.
	if err := tx.Commit(context.WithoutCancel(ctx)); err != nil {
		return rd, fmt.Errorf("error marking %d outbox rows published: %w", len(taken), err)
	}
	perDest := make(map[string]int, len(g.batches))
	for _, b := range g.batches {
		perDest[b.dest] += len(b.ids)
	}
	r.remember(taken)
	r.counted(rd, len(taken), perDest)
	r.olderTaken.Add(int64(len(olderRows)))
	r.handedRows.Add(int64(len(taken) - len(olderRows))) // first: a test that sees the round sees its rows
	r.handedRuns.Add(1)
	return rd, nil
}

// roundBytes is the size of rows' events as a round counts it (relayRoundBytes).
func roundBytes(rows []handedRow) int {
	n := 0
	for i := range rows {
		n += eventSize(&rows[i].e)
	}
	return n
}

// remember keeps ids, of rows just deleted (or moved) for good, among the relay's recent
// ones, which the check for older rows does not look for: the largest relayHandoffRounds ×
// BatchSize of them, sorted. Only the leading goroutine calls it.
func (r *Relay) remember(ids []int64) {
	r.recent = append(r.recent, ids...)
	slices.Sort(r.recent)
	if n := len(r.recent) - relayHandoffRounds*r.cfg.BatchSize; n > 0 {
		r.recent = r.recent[:copy(r.recent, r.recent[n:])]
	}
}

// HandedRounds returns how many rounds published rows handed over by this process
// (Handoff) rather than read from the table (tests, the bench).
func (r *Relay) HandedRounds() int64 { return r.handedRuns.Load() }

// HandedRows returns how many rows the rounds that HandedRounds counts published; the
// others of Published were read from the table (tests, the bench).
func (r *Relay) HandedRows() int64 { return r.handedRows.Load() }

// Overflows returns how many times the Handoff turned rows away because its relay was too
// far behind, each time sending the relay to the table until it caught up (tests, the
// bench).
func (h *Handoff) Overflows() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.overflows
}

// HandoffGapProbes returns how many ids between handed rows the relay looked for in the
// table, in its checks for older rows (tests, the bench).
func (r *Relay) HandoffGapProbes() int64 { return r.gapProbes.Load() }

// HandoffBelowProbes returns how many ids below handed rows the relay looked for one by
// one in its checks for older rows, and HandoffBelowWalks how many checks walked the
// primary key up from the floor instead (too many ids there that the relay had not
// deleted itself: tests, the bench).
func (r *Relay) HandoffBelowProbes() int64 { return r.belowProbes.Load() }

// HandoffBelowWalks: see HandoffBelowProbes.
func (r *Relay) HandoffBelowWalks() int64 { return r.belowWalks.Load() }

// HandoffOlderTaken counts the rows not handed over that the check for older rows found
// below or between handed rows and published in their round.
func (r *Relay) HandoffOlderTaken() int64 { return r.olderTaken.Load() }

// HandoffFallbacks returns how many times handed rows were put back because an older row
// was left in the table that the check could not take (tests, the bench).
func (r *Relay) HandoffFallbacks() int64 { return r.fallbacks.Load() }

package outbox

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

func handedOf(ids ...int64) *Handed {
	h := &Handed{ids: ids, events: make([]Event, len(ids))}
	for i := range h.events {
		h.events[i] = Event{Topic: "t", Payload: make([]byte, 100)}
	}
	return h
}

// TestHandoffBounds: a Handoff takes rows only while a relay is attached, at most max of
// them; past that it turns rows away and makes the relay read the table, forgetting what
// waits (it is all in the table).
func TestHandoffBounds(t *testing.T) {
	h := NewHandoff()
	require.False(t, h.hand([]*Handed{handedOf(1)}), "no relay leads")

	wakes := 0
	h.attach(func() { wakes++ }, 10, 1<<30)
	require.False(t, h.hand([]*Handed{{ids: []int64{1}}}), "ids and events must match (a result not read)")
	require.True(t, h.hand([]*Handed{handedOf(5, 6, 7), handedOf(2, 3)}))
	require.Equal(t, 1, wakes)
	rows, overflow := h.take(4, 1<<20)
	require.False(t, overflow)
	require.Equal(t, []int64{2, 5, 6, 7}, idsOf(rows), "the first rows handed, in id order")
	require.Equal(t, []int64{3}, h.waiting())

	require.True(t, h.hand([]*Handed{handedOf(8, 9, 10, 11, 12, 13, 14, 15, 16)}), "ten rows wait")
	require.False(t, h.hand([]*Handed{handedOf(17)}), "an eleventh is turned away")
	require.False(t, h.hand([]*Handed{handedOf(18)}), "and the next")
	require.EqualValues(t, 1, h.Overflows(), "one overflow until the relay takes again")
	rows, overflow = h.take(100, 1<<20)
	require.True(t, overflow)
	require.Empty(t, rows)
	require.Empty(t, h.waiting(), "what waited is forgotten: the relay reads the table")

	require.True(t, h.hand([]*Handed{handedOf(20, 21, 22)}))
	require.EqualValues(t, 1, h.Overflows())
	rows, _ = h.take(100, 2*eventSize(&Event{Topic: "t", Payload: make([]byte, 100)}))
	require.Equal(t, []int64{20, 21}, idsOf(rows), "a round's bytes are bounded")
	rows, _ = h.take(100, 1)
	require.Equal(t, []int64{22}, idsOf(rows), "one row at least")

	h.detach()
	require.False(t, h.hand([]*Handed{handedOf(30)}), "the relay stepped down")
	require.False(t, h.leadingNow())
}

// TestHandoffBoundsBytes: a Handoff also holds at most its bytes of events (4 MB for a
// relay), whatever its rows bound says, and counts what it takes, puts back and forgets.
func TestHandoffBoundsBytes(t *testing.T) {
	size := eventSize(&Event{Topic: "t", Payload: make([]byte, 100)})
	h := NewHandoff()
	h.attach(func() {}, 1000, 3*size)
	require.True(t, h.hand([]*Handed{handedOf(1, 2)}))
	require.True(t, h.hand([]*Handed{handedOf(3)}), "three events' bytes fit")
	require.False(t, h.hand([]*Handed{handedOf(4)}), "a fourth's do not, though the rows bound would take it")
	rows, overflow := h.take(100, 1<<20)
	require.True(t, overflow)
	require.Empty(t, rows)

	require.True(t, h.hand([]*Handed{handedOf(5, 6, 7)}), "forgotten rows count no more")
	rows, _ = h.take(2, 1<<20)
	require.Equal(t, []int64{5, 6}, idsOf(rows))
	require.True(t, h.hand([]*Handed{handedOf(8, 9)}), "taken rows count no more")
	h.putBack(rows)
	require.Equal(t, 5*size, h.bytes, "put back rows count again (7, 8, 9 and 5, 6)")
	require.False(t, h.hand([]*Handed{handedOf(10)}))

	h.attach(func() {}, 1000, size)
	require.True(t, h.hand([]*Handed{handedOf(11, 12, 13)}), "one transaction's events larger than the bound are taken when nothing waits")
	require.False(t, h.hand([]*Handed{handedOf(14)}))
}

func idsOf(rows []handedRow) []int64 {
	ids := make([]int64, len(rows))
	for i, r := range rows {
		ids[i] = r.id
	}
	return ids
}

// TestGapsBetween: the ids between the handed ones that are neither waiting nor published
// lately, and the bound beyond which the relay checks the whole range instead.
func TestGapsBetween(t *testing.T) {
	gaps, ok := gapsBetween([]int64{5, 6, 7}, 10)
	require.True(t, ok)
	require.Empty(t, gaps)
	gaps, ok = gapsBetween([]int64{5, 8, 12}, 10, []int64{11, 6, 40})
	require.True(t, ok)
	require.Equal(t, []int64{7, 9, 10}, gaps)
	gaps, ok = gapsBetween([]int64{5, 8, 12}, 10, []int64{11, 6, 40}, []int64{9, 10})
	require.True(t, ok)
	require.Equal(t, []int64{7}, gaps, "waiting or published lately")
	_, ok = gapsBetween([]int64{1, 100}, 10)
	require.False(t, ok, "too many gaps")
	gaps, ok = gapsBetween([]int64{1, 100}, 10, idsFrom(2, 99))
	require.True(t, ok, "the gap is all waiting rows")
	require.Empty(t, gaps)
	gaps, ok = gapsBetween([]int64{1, 100}, 10, idsFrom(2, 50), idsFrom(51, 95))
	require.True(t, ok, "waiting rows and rows published lately")
	require.Equal(t, []int64{96, 97, 98, 99}, gaps)
}

// TestGapsBetweenAgainstASearchEach: random ranges, handed ids and skip lists (with
// repeats, and ids outside the range) give the gaps a search of every skip list for each
// id gives, and the same answer to the limit.
func TestGapsBetweenAgainstASearchEach(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func(lo, hi int64, n int) []int64 {
		out := make([]int64, n)
		for i := range out {
			out[i] = lo + rng.Int64N(hi-lo+1)
		}
		return out
	}
	for range 2000 {
		lo := rng.Int64N(50)
		hi := lo + 1 + rng.Int64N(200)
		ids := append([]int64{lo, hi}, pick(lo, hi, rng.IntN(8))...)
		slices.Sort(ids)
		ids = slices.Compact(ids)
		var skip [][]int64
		for range rng.IntN(3) {
			skip = append(skip, pick(lo-20, hi+20, rng.IntN(120)))
		}
		limit := rng.IntN(150)
		var want []int64
		wantOK := true
		if n := ids[len(ids)-1] - ids[0] + 1 - int64(len(ids)); n > 0 {
		each:
			for id := ids[0] + 1; id < ids[len(ids)-1]; id++ {
				if slices.Contains(ids, id) {
					continue
				}
				for _, s := range skip {
					if slices.Contains(s, id) {
						continue each
					}
				}
				want = append(want, id)
			}
			wantOK = len(want) <= limit
		}
		gaps, ok := gapsBetween(ids, limit, skip...)
		require.Equal(t, wantOK, ok, "ids %v, limit %d, skip %v", ids, limit, skip)
		if ok {
			require.Equal(t, want, gaps, "ids %v, skip %v", ids, skip)
		}
	}
}

// TestHolesBelow: the ids from the floor up to the first handed one that the relay did not
// delete itself, and the bound beyond which the check walks the range instead.
func TestHolesBelow(t *testing.T) {
	holes, ok := holesBelow(10, 10, 5, nil)
	require.True(t, ok, "no range")
	require.Empty(t, holes)
	holes, ok = holesBelow(11, 10, 5, nil)
	require.True(t, ok, "a floor above the first id")
	require.Empty(t, holes)
	holes, ok = holesBelow(10, 20, 5, idsFrom(10, 19))
	require.True(t, ok)
	require.Empty(t, holes, "all deleted by the relay")
	holes, ok = holesBelow(10, 20, 5, []int64{2, 3, 10, 11, 13, 14, 15, 16, 19, 25})
	require.True(t, ok)
	require.Equal(t, []int64{12, 17, 18}, holes)
	holes, ok = holesBelow(10, 20, 3, []int64{10, 11, 13, 14, 15, 16, 19})
	require.True(t, ok, "exactly the limit")
	require.Equal(t, []int64{12, 17, 18}, holes)
	_, ok = holesBelow(10, 20, 2, []int64{10, 11, 13, 14, 15, 16, 19})
	require.False(t, ok, "one more than the limit")
	_, ok = holesBelow(0, 1_000_000, 100, idsFrom(500, 600))
	require.False(t, ok, "a floor far below: not even walked")
	_, ok = holesBelow(10, 20, -1, nil)
	require.False(t, ok, "no room left by the gaps")
}

// TestRelayRemembersRecentIDs: the relay keeps the largest ids it deleted lately, sorted,
// at most relayHandoffRounds × BatchSize of them (8 here).
func TestRelayRemembersRecentIDs(t *testing.T) {
	r := &Relay{cfg: RelayConfig{BatchSize: 8 / relayHandoffRounds}}
	r.remember([]int64{7, 3})
	require.Equal(t, []int64{3, 7}, r.recent)
	r.remember([]int64{9, 1, 8, 5, 12, 2, 20, 4})
	require.Equal(t, []int64{3, 4, 5, 7, 8, 9, 12, 20}, r.recent, "the two smallest are forgotten")
}

func idsFrom(from, to int64) []int64 {
	var ids []int64
	for id := from; id <= to; id++ {
		ids = append(ids, id)
	}
	return ids
}

// BenchmarkHolesBelow: the check's range below a round's first handed id as it is under
// load: the floor 12,000 ids below, the relay's 16,000 recent ids all but every hundredth.
func BenchmarkHolesBelow(b *testing.B) {
	var recent []int64
	for id := int64(1); id <= 16000; id++ {
		if id%100 != 0 {
			recent = append(recent, id)
		}
	}
	for b.Loop() {
		if holes, ok := holesBelow(1, 12001, 16000, recent); !ok || len(holes) != 120 {
			b.Fatalf("%d holes, ok %v", len(holes), ok)
		}
	}
}

// TestHandoffRecyclesTakenRows: a round that takes every waiting row takes the Handoff's
// array itself, and gives it back once done, emptied, for the rows handed next: under
// steady load handing and taking copy no row into a new array. A round put back, or a
// round that took only part of the rows, leaves the Handoff's rows as they were.
func TestHandoffRecyclesTakenRows(t *testing.T) {
	h := NewHandoff()
	h.attach(func() {}, 1000, 1<<30)
	batch := []*Handed{handedOf(1, 2, 3, 4)}
	round := func() {
		if !h.hand(batch) {
			t.Fatal("not handed")
		}
		rows, _ := h.take(100, 1<<20)
		if len(rows) != 4 {
			t.Fatalf("took %d rows", len(rows))
		}
		h.recycle(rows)
	}
	round()
	require.Zero(t, testing.AllocsPerRun(100, round), "hand, take and recycle every row")

	require.True(t, h.hand([]*Handed{handedOf(5, 6, 7)}))
	rows, _ := h.take(100, 1<<20)
	require.Equal(t, []int64{5, 6, 7}, idsOf(rows))
	require.Empty(t, h.waiting())
	require.True(t, h.hand([]*Handed{handedOf(8)}), "handed while the round runs: into the spare array")
	h.putBack(rows)
	h.recycle(rows)
	require.Equal(t, []int64{5, 6, 7, 8}, h.waiting(), "the round put back, with the row handed meanwhile")
	for _, row := range rows[:cap(rows)] {
		require.Zero(t, row, "a recycled array pins no event")
	}

	part, _ := h.take(2, 1<<20)
	require.Equal(t, []int64{5, 6}, idsOf(part))
	h.recycle(part)
	rest, _ := h.take(100, 1<<20)
	require.Equal(t, []int64{7, 8}, idsOf(rest), "a partial round copied its rows: the others are intact")
}

package main

import (
	"strings"
	"testing"
)

// pruneRun is a steady state's samples: a first half (the third period, the reference) and
// a second (ending with the last period), with the largest pkey and unexpired rows given
// for each.
func pruneRun(refPKey, endPKey float64, refUnexpired, endUnexpired int64) *Results {
	s := func(half int, role string, pkey float64, unexpired int64) Sizes {
		return Sizes{Half: half, Role: role, ProcessedHeapMiB: 10, ProcessedPKeyMiB: pkey, ProcessedExpMiB: 1,
			ProcessedTotalMiB: 11 + pkey, OutboxTotalMiB: 2, ProcessedUnexpired: unexpired}
	}
	return &Results{PruneSizes: []Sizes{
		s(0, "", refPKey*0.5, refUnexpired/2), // before the steady state: not compared
		s(1, "third", refPKey*0.95, refUnexpired), s(1, "reference", refPKey, refUnexpired),
		// A smaller sample inside a window does not count: the window's largest does.
		s(2, "", endPKey*0.9, endUnexpired), s(2, "end", endPKey*0.8, endUnexpired), s(2, "end", endPKey, endUnexpired),
	}}
}

func pruneGoalOf(t *testing.T, r *Results) Ratio {
	t.Helper()
	for _, ra := range r.ratios() {
		if strings.HasPrefix(ra.Name, "processed_messages, largest size") {
			return ra
		}
	}
	t.Fatal("no size goal")
	return Ratio{}
}

// epochRun is pruneRun with epochs: each sample holds held rows in the epochs that have an
// unexpired record, half of them unexpired, and a heap and an expires_at index in
// proportion to its primary key (an epoch dropped whole takes its share of each).
func epochRun(refPKey, endPKey float64, refHeld, endHeld int64) *Results {
	r := pruneRun(refPKey, endPKey, refHeld/2, endHeld/2)
	r.PruneByEpochs = true
	for i := range r.PruneSizes {
		s := &r.PruneSizes[i]
		s.ProcessedEpochsHeld = s.ProcessedUnexpired * 2
		s.ProcessedRows = s.ProcessedEpochsHeld
		s.ProcessedHeapMiB, s.ProcessedExpMiB = s.ProcessedPKeyMiB/2, s.ProcessedPKeyMiB/20
	}
	return r
}

func TestPruneGoalSaysNoWhenAnIndexGrows(t *testing.T) {
	// rows are the unexpired rows row by row, the rows of the epochs held with epochs.
	cases := []struct {
		name             string
		epochs           bool
		refPKey, endPKey float64
		refRows, endRows int64
		met              bool
	}{
		{"flat", false, 20, 20, 100000, 100000, true},
		{"within the tolerance", false, 20, 20.3, 100000, 100000, true},
		{"pkey grew, same rows", false, 20, 22, 100000, 100000, false},
		{"pkey grew with the rows", false, 20, 22, 100000, 110000, true},
		{"pkey grew more than the rows", false, 20, 24, 100000, 110000, false},
		// Row by row, fewer rows at the end excuse nothing (a table whose rows are
		// deleted does not shrink), nor do they count against it.
		{"fewer rows, flat", false, 20, 20, 100000, 80000, true},
		{"fewer rows, pkey grew", false, 20, 22, 100000, 80000, false},

		{"epochs, flat", true, 20, 20, 200000, 200000, true},
		{"epochs, pkey grew, same rows", true, 20, 22, 200000, 200000, false},
		{"epochs, pkey grew with the rows", true, 20, 22, 200000, 220000, true},
		// An epoch dropped whole leaves nothing behind: fewer rows held make a smaller
		// table, and a table as large with fewer rows is one that grew per row.
		{"epochs, fewer rows, smaller", true, 20, 16, 200000, 160000, true},
		{"epochs, fewer rows, flat", true, 20, 20, 200000, 160000, false},
	}
	for _, c := range cases {
		run, want := pruneRun, "per unexpired row"
		if c.epochs {
			run, want = epochRun, "per row of the epochs held"
		}
		g := pruneGoalOf(t, run(c.refPKey, c.endPKey, c.refRows, c.endRows))
		if g.Met != c.met {
			t.Errorf("%s: goal %.3f met %v, want %v", c.name, g.Value, g.Met, c.met)
		}
		if !strings.Contains(g.Name, want) {
			t.Errorf("%s: goal %q does not say it is %s", c.name, g.Name, want)
		}
		if !c.met && !c.epochs && !strings.Contains(g.Name, "pkey") {
			t.Errorf("%s: worst relation %q, want the pkey", c.name, g.Name)
		}
	}
	// A pruner that falls behind keeps an epoch it could drop: the rows held grow, the
	// epochs held (those with an unexpired record) do not, and the goal says no.
	r := prunerBehind(epochRun(20, 22, 200000, 200000))
	if g := pruneGoalOf(t, r); g.Met {
		t.Errorf("a pruner behind: goal %.3f met", g.Value)
	}
	// The same with sizes that grew with every row the table holds: per row in the
	// table they are flat, per row held they are not. No sample of the second half has
	// the pruner caught up, so the goal compares every sample.
	r = prunerBehind(epochRun(20, 30, 200000, 200000))
	if g := pruneGoalOf(t, r); g.Met {
		t.Errorf("a pruner behind, sizes in proportion to the rows left: goal %.3f met", g.Value)
	}
	// A pruner that keeps up drops an expired epoch on its next pass: a sample taken before
	// it holds that epoch's rows too, in a larger table. With other samples in each half,
	// the goal leaves it out (phase 38).
	r = epochRun(20, 20, 200000, 200000)
	r.PruneSizes = append(r.PruneSizes, Sizes{Half: 2, ProcessedHeapMiB: 15, ProcessedPKeyMiB: 30, ProcessedExpMiB: 1.5,
		ProcessedTotalMiB: 46.5, OutboxTotalMiB: 2, ProcessedUnexpired: 100000, ProcessedEpochsHeld: 200000, ProcessedRows: 300000})
	if g := pruneGoalOf(t, r); !g.Met {
		t.Errorf("an expired epoch waiting for the pruner's next pass: goal %.3f not met", g.Value)
	}
}

// prunerBehind makes every sample of r's second half hold half as many rows again as its
// epochs held: an epoch the pruner could drop and has not, at every sample.
func prunerBehind(r *Results) *Results {
	for i := range r.PruneSizes {
		if s := &r.PruneSizes[i]; s.Half == 2 {
			s.ProcessedRows = s.ProcessedEpochsHeld * 3 / 2
		}
	}
	return r
}

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

func TestPruneGoalSaysNoWhenAnIndexGrows(t *testing.T) {
	cases := []struct {
		name                     string
		refPKey, endPKey         float64
		refUnexpired, endUnexpir int64
		met                      bool
	}{
		{"flat", 20, 20, 100000, 100000, true},
		{"within the tolerance", 20, 20.3, 100000, 100000, true},
		{"pkey grew, same rows", 20, 22, 100000, 100000, false},
		{"pkey grew with the rows", 20, 22, 100000, 110000, true},
		{"pkey grew more than the rows", 20, 24, 100000, 110000, false},
		// Fewer rows at the end excuse nothing (a table does not shrink), nor do they
		// count against it.
		{"fewer rows, flat", 20, 20, 100000, 80000, true},
		{"fewer rows, pkey grew", 20, 22, 100000, 80000, false},
	}
	for _, c := range cases {
		g := pruneGoalOf(t, pruneRun(c.refPKey, c.endPKey, c.refUnexpired, c.endUnexpir))
		if g.Met != c.met {
			t.Errorf("%s: goal %.3f met %v, want %v", c.name, g.Value, g.Met, c.met)
		}
		if !c.met && !strings.Contains(g.Name, "pkey") {
			t.Errorf("%s: worst relation %q, want the pkey", c.name, g.Name)
		}
	}
}

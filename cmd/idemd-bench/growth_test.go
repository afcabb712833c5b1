package main

import (
	"strings"
	"testing"
)

// TestStrongest: a growth point's limit is the fastest of the runs tried at its size,
// whichever form it has, and its note names the others; the rows tried are left as they were.
func TestStrongest(t *testing.T) {
	unnest8 := limitConfig{method: methodUnnest, batch: 500, workers: 8}
	unnest4 := limitConfig{method: methodUnnest, batch: 500, workers: 4}
	claim := limitConfig{method: methodClaim, batch: 500, workers: 4}
	rows := []*Row{
		{Rate: 23410, config: unnest8, Note: "faster of two runs on fresh ids"},
		{Rate: 30000, config: unnest4, Note: "faster of two runs on fresh ids"},
		{Rate: 34507, config: claim, Note: "faster of two runs on fresh ids"},
	}
	got := strongest(rows)
	if got.config != claim || got.Rate != 34507 {
		t.Fatalf("strongest = %s %.0f, want idemd's claim at 34507", got.config, got.Rate)
	}
	for _, want := range []string{unnest8.String() + " 23410", unnest4.String() + " 30000"} {
		if !strings.Contains(got.Note, want) {
			t.Errorf("note %q does not name %q", got.Note, want)
		}
	}
	if rows[2].Note != "faster of two runs on fresh ids" {
		t.Errorf("the claim's own row was changed: %q", rows[2].Note)
	}
	if one := strongest(rows[:1]); one.Note != rows[0].Note || one.Rate != rows[0].Rate {
		t.Errorf("one row: got %q %.0f", one.Note, one.Rate)
	}
}

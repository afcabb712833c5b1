package main

import (
	"math"
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

// TestGrowthGoalFromRounds: the growth goal compares the medians of the two points' rounds
// (one slow round moves neither), the empty point being the one measured closest to the
// largest; the fastest runs' ratio is kept, for information.
func TestGrowthGoalFromRounds(t *testing.T) {
	point := func(rows int, limit, consumer float64, rounds ...GrowthRound) GrowthPoint {
		return GrowthPoint{Rows: rows, Limit: &Row{Rate: limit}, Consumer: &Row{Rate: consumer}, Rounds: rounds}
	}
	r := &Results{Growth: []GrowthPoint{
		// The first empty point is further from the largest than the second: not compared.
		point(0, 60000, 60000, GrowthRound{Limit: 60000, Consumer: 60000}),
		point(1000000, 50000, 20000,
			GrowthRound{Limit: 50000, Consumer: 20000}, // 0.40
			GrowthRound{Limit: 40000, Consumer: 8000},  // 0.20, a slow consumer run
			GrowthRound{Limit: 45000, Consumer: 18900}, // 0.42
		),
		point(0, 62000, 31000,
			GrowthRound{Limit: 62000, Consumer: 27900}, // 0.45
			GrowthRound{Limit: 40000, Consumer: 20000}, // 0.50
			GrowthRound{Limit: 30000, Consumer: 27000}, // 0.90, a slow limit run
		),
	}}
	var goal, fastest *Ratio
	for _, ra := range r.ratios() {
		switch {
		case strings.HasPrefix(ra.Name, "consumer/limit at 1 M rows / at 0 rows, medians"):
			goal = &ra
		case strings.HasPrefix(ra.Name, "consumer/limit at 1 M rows / at 0 rows, the fastest runs"):
			fastest = &ra
		}
	}
	if goal == nil || fastest == nil {
		t.Fatalf("ratios %v: want the goal from the rounds and the fastest runs' ratio", r.ratios())
	}
	if want := 0.40 / 0.50; math.Abs(goal.Value-want) > 1e-9 || goal.Goal != ">= 0.90" || goal.Met {
		t.Errorf("goal = %+v, want %.3f (0.40 / 0.50), not met", *goal, want)
	}
	if want := (20000.0 / 50000) / (31000.0 / 62000); math.Abs(fastest.Value-want) > 1e-9 || fastest.Goal != "(info)" {
		t.Errorf("fastest runs = %+v, want %.3f for information", *fastest, want)
	}
	// Without rounds (a run's JSON from before phase 34) the fastest runs are the goal.
	for i := range r.Growth {
		r.Growth[i].Rounds = nil
	}
	for _, ra := range r.ratios() {
		if strings.HasPrefix(ra.Name, "consumer/limit at 1 M rows / at 0 rows") && ra.Goal != ">= 0.90" {
			t.Errorf("without rounds: %+v, want the goal", ra)
		}
	}
}

// TestRoundsRatioMedian: an even number of rounds takes the mean of the middle two.
func TestRoundsRatioMedian(t *testing.T) {
	g := GrowthPoint{Rounds: []GrowthRound{{Limit: 100, Consumer: 40}, {Limit: 100, Consumer: 10}, {Limit: 100, Consumer: 60}, {Limit: 100, Consumer: 50}}}
	m, lo, hi, ok := g.roundsRatio()
	if !ok || math.Abs(m-0.45) > 1e-9 || lo != 0.1 || hi != 0.6 {
		t.Fatalf("roundsRatio = %v %v %v %v, want 0.45 0.1 0.6 true", m, lo, hi, ok)
	}
	if _, _, _, ok := (GrowthPoint{}).roundsRatio(); ok {
		t.Fatal("no rounds: ok")
	}
}

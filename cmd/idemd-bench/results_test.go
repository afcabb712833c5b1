package main

import (
	"math"
	"strings"
	"testing"
)

// TestRatiosByCPU: the consumers' ratios by CPU per message use the limit row that the
// throughput ratio uses (the faster of the two) and leave the broker's CPU out.
func TestRatiosByCPU(t *testing.T) {
	r := &Results{
		Limit:      &Row{Rate: 60000, CPU: &CPU{IdemdUs: 4, PostgresUs: 30}},
		LimitAgain: &Row{Rate: 63000, CPU: &CPU{IdemdUs: 3, PostgresUs: 25}},
		Consumer:   &Row{Rate: 33000, CPU: &CPU{IdemdUs: 17, PostgresUs: 39, GeneratorUs: 10}},
		// No CPU counted: no figure.
		ConsumerBare: &Row{Rate: 38000},
	}
	got := map[string]float64{}
	for _, ra := range r.ratios() {
		if strings.Contains(ra.Name, "by CPU per message") {
			got[ra.Name] = ra.Value
		}
	}
	if len(got) != 1 {
		t.Fatalf("ratios by CPU: %v, want the consumer's alone", got)
	}
	for name, v := range got {
		if !strings.HasPrefix(name, "consumer (relay running) / limit") || math.Abs(v-0.5) > 1e-9 {
			t.Fatalf("%s = %v, want 0.5 ((3+25)/(17+39))", name, v)
		}
	}
}

// TestPeakRSSIsIdemds: the peak RSS goal is over idemd's loads only, not its baselines'
// (with sixteen partitions the bare consumer peaked at 262 MiB, idemd at 113).
func TestPeakRSSIsIdemds(t *testing.T) {
	r := &Results{
		Consumer:           &Row{Rate: 1, PeakRSSMiB: 113},
		ConsumerBare:       &Row{Rate: 1, PeakRSSMiB: 226},
		ConsumerBareDelete: &Row{Rate: 1, PeakRSSMiB: 262},
		Naive:              &Row{Rate: 1, PeakRSSMiB: 300},
		Receiver:           &Row{Rate: 1, PeakRSSMiB: 90},
		Growth:             []GrowthPoint{{Naive: &Row{Rate: 1, PeakRSSMiB: 400}}},
	}
	for _, ra := range r.ratios() {
		if strings.HasPrefix(ra.Name, "peak RSS") {
			if ra.Value != 113 {
				t.Fatalf("%s = %v, want 113 (the consumer's)", ra.Name, ra.Value)
			}
			return
		}
	}
	t.Fatal("no peak RSS figure")
}

// TestFigure: ratios print with two decimals, and those under 0.01 with two significant
// digits rather than as 0.00.
func TestFigure(t *testing.T) {
	for v, want := range map[float64]string{0.54: "0.54", 22.434: "22.43", 0: "0.00", 0.0033: "0.0033", 0.01: "0.01", 0.00012345: "0.00012"} {
		if got := figure(v); got != want {
			t.Errorf("figure(%v) = %q, want %q", v, got, want)
		}
	}
}

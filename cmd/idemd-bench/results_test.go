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

package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/pgtest"
)

// TestRepeatsTellLateFromEarly: an id applied again at least one retention after the
// application before it is a late repeat (allowed); sooner, a duplicate. The gaps are set
// by hand on the effects table the bench creates.
func TestRepeatsTellLateFromEarly(t *testing.T) {
	db := pgtest.New(t)
	e := &env{pool: db.Pool, schema: db.Schema}
	ctx := context.Background()
	db.Exec(t, fmt.Sprintf(effectsDDL, e.q()))
	for _, row := range []struct {
		id    string
		after time.Duration // after the run's start
	}{
		{"once", 0},
		{"late", 0}, {"late", 10 * time.Second}, // exactly one retention: late
		{"early", time.Second}, {"early", 3 * time.Second}, {"early", 13 * time.Second}, // 2 s early, then 10 s late
		{"twin", 5 * time.Second}, {"twin", 5 * time.Second}, // the same transaction's time: early
	} {
		db.Exec(t, "INSERT INTO "+e.q()+".effects (message_id, applied_at) VALUES ($1, '2026-01-01T00:00:00Z'::timestamptz + $2::bigint * interval '1 microsecond')",
			row.id, row.after.Microseconds())
	}

	r, err := e.repeats(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if r.late != 2 || r.early != 2 || r.earlyGaps != [2]time.Duration{0, 2 * time.Second} {
		t.Fatalf("repeats under 10 s: %+v, want 2 late, 2 early with gaps 0 to 2 s", r)
	}
	if s := r.String(); !strings.Contains(s, "2 effects applied an id again sooner") || !strings.Contains(s, "2 later than that") {
		t.Fatalf("repeats read %q", s)
	}

	// Without a retention every repeat is a duplicate.
	if r, err = e.repeats(ctx, 0); err != nil || r.late != 0 || r.early != 4 {
		t.Fatalf("repeats without a retention: %+v, %v; want 4 early", r, err)
	}
}

// TestOnceVerdict: the check fails on a duplicate within the retention, on a lost effect,
// on a missing event, and on a lost effect beside a duplicate (whose count of effects is
// right); late repeats pass.
func TestOnceVerdict(t *testing.T) {
	for _, c := range []struct {
		name                  string
		effects, events, uniq int
		r                     repeats
		ok                    bool
	}{
		{"once", 100, 100, 100, repeats{}, true},
		{"late repeats", 103, 100, 100, repeats{late: 3}, true},
		{"a duplicate", 101, 100, 100, repeats{early: 1}, false},
		{"an effect lost", 99, 100, 100, repeats{}, false},
		{"an event lost", 100, 99, 100, repeats{}, false},
		{"an effect lost beside a duplicate", 100, 100, 100, repeats{early: 1}, false},
		{"an effect lost beside a late repeat", 100, 100, 100, repeats{late: 1}, false},
	} {
		if err := onceVerdict(c.effects, c.events, c.uniq, c.r); (err == nil) != c.ok {
			t.Errorf("%s: %v, want ok %v", c.name, err, c.ok)
		}
	}
}

package gctune

import (
	"runtime/debug"
	"testing"
)

func TestDefaultLeavesAnExplicitGOGCAlone(t *testing.T) {
	before := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(before) })

	if Default(func(string) (string, bool) { return "50", true }) {
		t.Fatal("Default changed the collector while GOGC was set")
	}
	if got := debug.SetGCPercent(100); got != 100 {
		t.Fatalf("with GOGC set, the percent moved to %d", got)
	}

	if !Default(func(string) (string, bool) { return "", false }) {
		t.Fatal("Default did not apply without GOGC")
	}
	if got := debug.SetGCPercent(100); got != Percent {
		t.Fatalf("without GOGC, the percent is %d, want %d", got, Percent)
	}
}

// Package gctune gives idemd's processes their garbage collector's default.
//
// idemd allocates a few kilobytes per message (pgx encodes each batch's parameters into
// buffers it does not keep, kafka-go copies each record) over a live heap of a few tens of
// megabytes, so that with Go's default (GOGC=100) a collection starts every few tens of
// megabytes allocated and the collector took about a fifth of the daemon's CPU under load.
// At GOGC=200 the consumer spent 15 % less CPU per message and ran 7 % faster, for a peak
// RSS of about 110 MiB instead of 80 (BENCHMARKS.md, phase 12). GOGC and GOMEMLIMIT in the
// environment still rule: Go reads them at start, and Default leaves them alone.
package gctune

import (
	"os"
	"runtime/debug"
)

// Percent is the GOGC idemd runs with when the environment does not set it.
const Percent = 200

// Default sets the collector's target to Percent unless GOGC is set in the environment
// (lookup is os.LookupEnv). It reports whether it set it.
func Default(lookup func(string) (string, bool)) bool {
	if _, ok := lookup("GOGC"); ok {
		return false
	}
	debug.SetGCPercent(Percent)
	return true
}

// DefaultFromEnv is Default with the process's environment.
func DefaultFromEnv() bool { return Default(os.LookupEnv) }

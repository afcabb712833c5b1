//go:build race

package pgarray_test

// raceDetector: the race detector's instrumentation allocates, so the tests that count
// allocations do not hold under it.
const raceDetector = true

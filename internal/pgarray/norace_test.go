//go:build !race

package pgarray_test

const raceDetector = false

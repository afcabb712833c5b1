// Package testname makes broker resource names unique to one test and one run, from the
// test's name, so that tests sharing a broker never meet each other's topics or queues.
package testname

import (
	"crypto/rand"
	"encoding/hex"
	"regexp"
	"testing"
)

// Unique returns the tail of tb's name, with every run of characters that unsafe matches
// replaced by '_' and cut to at most keep characters, then '-' and 8 random hex digits.
func Unique(tb testing.TB, unsafe *regexp.Regexp, keep int) string {
	tb.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := unsafe.ReplaceAllString(tb.Name(), "_")
	if len(name) > keep {
		name = name[len(name)-keep:]
	}
	return name + "-" + hex.EncodeToString(b[:])
}

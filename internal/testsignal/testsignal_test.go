package testsignal_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/testsignal"
)

func TestZeroSignalIsInert(t *testing.T) {
	t.Parallel()
	var s testsignal.Signal[int]
	for i := range 10_000 {
		s.Signal(i) // no test listens: nothing happens, nothing blocks
	}
	require.Panics(t, func() { s.C() })
}

func TestWaitFor(t *testing.T) {
	t.Parallel()
	var s testsignal.Signal[int]
	s.Init(t)
	go func() {
		for i := range 5 {
			s.Signal(i)
		}
	}()
	require.Equal(t, 0, s.Wait(t))
	require.Equal(t, 3, s.WaitFor(t, "three", func(v int) bool { return v == 3 }))
	require.Equal(t, 4, s.Wait(t))
	s.RequireNone(t)
}

// recorder is a testsignal.TB that records instead of failing the real test.
type recorder struct{ errors []string }

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, a ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, a...))
}
func (r *recorder) Fatalf(format string, a ...any) { r.Errorf(format, a...) }

// TestFullBufferFailsTheTestNotTheComponent: a component signalling a test that never reads
// is not blocked; the test is failed instead.
func TestFullBufferFailsTheTestNotTheComponent(t *testing.T) {
	t.Parallel()
	var (
		s   testsignal.Signal[int]
		rec recorder
	)
	s.Init(&rec)
	for i := range 1001 {
		s.Signal(i)
	}
	require.Len(t, rec.errors, 1)
	require.Contains(t, rec.errors[0], "full")
}

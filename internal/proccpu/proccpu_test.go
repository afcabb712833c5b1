package proccpu_test

import (
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/proccpu"
)

// rusage is this process's CPU time as getrusage counts it.
func rusage(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func TestOfCountsThisProcessesWork(t *testing.T) {
	before, ok := proccpu.Of(os.Getpid())
	require.True(t, ok)
	// Spin until the kernel counted 100 ms of this process's CPU, however long that takes on
	// a busy machine (100 ms of wall time gave 40 ms of CPU once, in CI).
	for start := rusage(t); rusage(t)-start < 100*time.Millisecond; {
	}
	after, ok := proccpu.Of(os.Getpid())
	require.True(t, ok)
	require.GreaterOrEqual(t, after-before, 80*time.Millisecond, "100 ms of CPU, counted in ticks of 10 ms")
	_, ok = proccpu.Of(-1)
	require.False(t, ok)
}

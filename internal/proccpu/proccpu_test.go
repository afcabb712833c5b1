package proccpu_test

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/proccpu"
)

func TestOfCountsThisProcessesWork(t *testing.T) {
	before, ok := proccpu.Of(os.Getpid())
	require.True(t, ok)
	for start := time.Now(); time.Since(start) < 100*time.Millisecond; {
	}
	after, ok := proccpu.Of(os.Getpid())
	require.True(t, ok)
	require.GreaterOrEqual(t, after-before, 50*time.Millisecond, "100 ms spinning, counted in ticks of 10 ms")
	_, ok = proccpu.Of(-1)
	require.False(t, ok)
}

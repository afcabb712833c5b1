package outbox

import (
	"testing"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
)

// TestTieredWriterTakesTheSmallestThatHoldsAWrite: a write goes to the smallest Writer
// whose BatchSize holds all of its records, a write larger than every BatchSize to the
// largest; tiers at or above the largest are left out.
func TestTieredWriterTakesTheSmallestThatHoldsAWrite(t *testing.T) {
	mk := func(n int) *kafka.Writer { return &kafka.Writer{BatchSize: n} }
	w := newTieredWriter(4000, mk)
	for n, want := range map[int]int{1: 64, 64: 64, 65: 128, 1000: 1024, 1025: 2048, 2048: 2048, 2049: 4000, 4000: 4000, 9000: 4000} {
		require.Equal(t, want, w.writer(n).BatchSize, "a write of %d records", n)
	}
	small := newTieredWriter(500, mk)
	require.Len(t, small.ws, 4)
	require.Equal(t, 500, small.writer(257).BatchSize)
	require.Equal(t, 500, small.writer(501).BatchSize)
	require.Equal(t, 64, newTieredWriter(64, mk).writer(1).BatchSize)
	require.Len(t, newTieredWriter(64, mk).ws, 1)
}

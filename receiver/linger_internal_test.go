package receiver

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A batch lingers half the recent transactions' mean duration, at most Linger: quick
// commits make short waits, slow ones wait the whole Linger.
func TestLingerFollowsTheTransactions(t *testing.T) {
	t.Parallel()
	r := &Receiver{cfg: Config{Linger: 2 * time.Millisecond}}
	require.Equal(t, 2*time.Millisecond, r.lingerNow(), "before any transaction: Linger")

	r.observeTx(time.Millisecond)
	require.Equal(t, 500*time.Microsecond, r.lingerNow(), "the first transaction is the mean")

	for range 200 {
		r.observeTx(1600 * time.Microsecond)
	}
	require.InDelta(t, float64(800*time.Microsecond), float64(r.lingerNow()), float64(10*time.Microsecond), "quick commits: half of them")

	// Slower commits (the database's CPU is the bound): the wait grows to Linger, no more.
	for range 30 {
		r.observeTx(3 * time.Millisecond)
	}
	require.Greater(t, r.lingerNow(), 1200*time.Microsecond, "it follows within a few dozen transactions")
	for range 200 {
		r.observeTx(50 * time.Millisecond)
	}
	require.Equal(t, 2*time.Millisecond, r.lingerNow())

	// One stalled transaction moves the mean by a sixteenth of its excess.
	r = &Receiver{cfg: Config{Linger: time.Second}}
	r.observeTx(time.Millisecond)
	r.observeTx(2*time.Second + time.Millisecond)
	require.Equal(t, (time.Millisecond+2*time.Second/txMeanWeight)/2, r.lingerNow())
}

// Batches end at once on many goroutines: the mean stays within the durations seen.
func TestLingerMeanUnderConcurrentBatches(t *testing.T) {
	t.Parallel()
	r := &Receiver{cfg: Config{Linger: time.Hour}}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 1000 {
				r.observeTx(time.Duration(1+(g+i)%4) * time.Millisecond)
			}
		})
	}
	wg.Wait()
	mean := 2 * r.lingerNow()
	require.GreaterOrEqual(t, mean, time.Millisecond)
	require.LessOrEqual(t, mean, 4*time.Millisecond)
}

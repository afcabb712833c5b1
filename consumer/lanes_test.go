package consumer

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLanes: a batch waits for the earlier batches of its ordered lanes only; after a
// release, the messages of the released lane received until then are held back (released
// too), unordered ones and other lanes are not, and a message of the lane received after the
// release is applied.
func TestLanes(t *testing.T) {
	l := newLanes()
	rec := func(ordered bool, lane string) *record {
		r := &record{broker: &brokerMessage{Ordered: ordered, Lane: lane}}
		l.number(r)
		return r
	}
	a1, b1, u1 := rec(true, "a"), rec(true, "b"), rec(false, "")
	a2, u2, c1 := rec(true, "a"), rec(false, ""), rec(true, "c")
	first, second, third := []*record{a1, b1, u1}, []*record{a2, u2}, []*record{c1}

	wait, done1 := l.enqueue(first)
	require.Empty(t, wait)
	wait, done2 := l.enqueue(second)
	require.Equal(t, []chan struct{}{done1}, wait, "lane a waits for the first batch")
	wait, done3 := l.enqueue(third)
	require.Empty(t, wait, "lane c waits for nothing")

	l.breakAfter([]*record{a1, u1}) // the first batch was released
	l.finish(first, done1)
	keep, behind := l.split(second)
	require.Equal(t, []*record{u2}, keep)
	require.Equal(t, []*record{a2}, behind, "a2 would overtake a1's redelivery")
	l.finish(second, done2)
	keep, behind = l.split(third)
	require.Equal(t, third, keep)
	require.Empty(t, behind)
	l.finish(third, done3)

	a1again := rec(true, "a") // the redelivery
	keep, behind = l.split([]*record{a1again})
	require.Equal(t, []*record{a1again}, keep)
	require.Empty(t, behind)
	require.Empty(t, l.tail, "finished batches are forgotten")
	require.Empty(t, l.broken)
}

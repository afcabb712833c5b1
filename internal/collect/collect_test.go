package collect

import (
	"testing"
	"time"
)

// TestBatch: a batch stops at its size, or once the linger passes with nothing
// more at hand, and reports the channel's close with what it holds.
func TestBatch(t *testing.T) {
	in := make(chan int, 10)
	for i := range 5 {
		in <- i
	}
	batch, open := Batch(in, 3, time.Hour, nil)
	if len(batch) != 3 || !open || batch[0] != 0 || batch[2] != 2 {
		t.Fatalf("full batch: %d values, open %v", len(batch), open)
	}
	start := time.Now()
	batch, open = Batch(in, 3, 20*time.Millisecond, batch[:0])
	if len(batch) != 2 || !open || batch[0] != 3 {
		t.Fatalf("lingered batch: %d values, open %v", len(batch), open)
	}
	if waited := time.Since(start); waited < 20*time.Millisecond {
		t.Fatalf("returned after %s, before the linger", waited)
	}
	in <- 5
	close(in)
	batch, open = Batch(in, 3, time.Hour, batch[:0])
	if len(batch) != 1 || open || batch[0] != 5 {
		t.Fatalf("closed with one: %d values, open %v", len(batch), open)
	}
	if batch, open = Batch(in, 3, time.Hour, batch[:0]); len(batch) != 0 || open {
		t.Fatalf("closed and empty: %d values, open %v", len(batch), open)
	}
}

// TestDeal: items go to the hands in turn; no more hands than items, none for no items.
func TestDeal(t *testing.T) {
	got := Deal([]int{0, 1, 2, 3, 4}, 2)
	if len(got) != 2 || len(got[0]) != 3 || got[0][2] != 4 || len(got[1]) != 2 || got[1][1] != 3 {
		t.Fatalf("five items to two hands: %v", got)
	}
	if got := Deal([]int{7, 8}, 4); len(got) != 2 || got[0][0] != 7 || got[1][0] != 8 {
		t.Fatalf("two items to four hands: %v", got)
	}
	if got := Deal([]int(nil), 4); len(got) != 0 {
		t.Fatalf("no items: %v", got)
	}
}

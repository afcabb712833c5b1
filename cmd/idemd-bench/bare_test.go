package main

import (
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// TestCollectMessages: a batch stops at its size, or once the linger passes with nothing
// more at hand, and reports the channel's close with what it holds.
func TestCollectMessages(t *testing.T) {
	in := make(chan kafka.Message, 10)
	for i := range 5 {
		in <- kafka.Message{Offset: int64(i)}
	}
	batch, open := collectMessages(in, 3, time.Hour, nil)
	if len(batch) != 3 || !open || batch[0].Offset != 0 || batch[2].Offset != 2 {
		t.Fatalf("full batch: %d messages, open %v", len(batch), open)
	}
	start := time.Now()
	batch, open = collectMessages(in, 3, 20*time.Millisecond, batch[:0])
	if len(batch) != 2 || !open || batch[0].Offset != 3 {
		t.Fatalf("lingered batch: %d messages, open %v", len(batch), open)
	}
	if waited := time.Since(start); waited < 20*time.Millisecond {
		t.Fatalf("returned after %s, before the linger", waited)
	}
	in <- kafka.Message{Offset: 5}
	close(in)
	batch, open = collectMessages(in, 3, time.Hour, batch[:0])
	if len(batch) != 1 || open || batch[0].Offset != 5 {
		t.Fatalf("closed with one: %d messages, open %v", len(batch), open)
	}
	if batch, open = collectMessages(in, 3, time.Hour, batch[:0]); len(batch) != 0 || open {
		t.Fatalf("closed and empty: %d messages, open %v", len(batch), open)
	}
}

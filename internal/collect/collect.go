// Package collect gathers what a channel delivers into batches: the consumer's doors batch
// their messages with it (BatchSize, Linger); and deals items out to workers (the Kafka
// door's partitions).
package collect

import "time"

// Batch waits for a first value from in, then appends values to batch until it holds size,
// or until linger has passed with none at hand; it waits for no more than linger in all.
// open is false once in is closed, and batch then holds what came before the close.
func Batch[T any](in <-chan T, size int, linger time.Duration, batch []T) (_ []T, open bool) {
	first, ok := <-in
	if !ok {
		return batch, false
	}
	batch = append(batch, first)
	var timer <-chan time.Time
	for len(batch) < size {
		select {
		case v, ok := <-in:
			if !ok {
				return batch, false
			}
			batch = append(batch, v)
			continue
		default:
		}
		if timer == nil {
			t := time.NewTimer(linger)
			defer t.Stop()
			timer = t.C
		}
		select {
		case v, ok := <-in:
			if !ok {
				return batch, false
			}
			batch = append(batch, v)
		case <-timer:
			return batch, true
		}
	}
	return batch, true
}

// Deal deals items out to at most n hands, in turn: item i goes to hand i mod the number
// of hands, which is n, or fewer when there are fewer items.
func Deal[T any](items []T, n int) [][]T {
	hands := make([][]T, min(n, len(items)))
	for i, v := range items {
		hands[i%len(hands)] = append(hands[i%len(hands)], v)
	}
	return hands
}

package kafkatest

import (
	"sync"
	"testing"
	"time"
)

// CommitLog records the offsets a test's consumers committed, from their OnOffsetCommit
// hook (Record), so that the test waits on the consumers' own signal (Wait) rather than
// polls the broker.
type CommitLog struct {
	mu      sync.Mutex
	next    map[int]int64
	changed chan struct{}
}

// NewCommitLog returns an empty log.
func NewCommitLog() *CommitLog {
	return &CommitLog{next: map[int]int64{}, changed: make(chan struct{}, 1)}
}

// Record notes that the offset next of partition was committed (a consumer's
// OnOffsetCommit).
func (l *CommitLog) Record(_ string, partition int, next int64) {
	l.mu.Lock()
	l.next[partition] = max(l.next[partition], next)
	l.mu.Unlock()
	select {
	case l.changed <- struct{}{}:
	default:
	}
}

// Wait returns once cond holds for the committed offsets of partitions 0 to partitions-1
// (-1 where none was committed). It checks after each commit; it fails the test when
// timeout passes first.
func (l *CommitLog) Wait(tb testing.TB, timeout time.Duration, partitions int, cond func(offs []int64) bool) {
	tb.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		offs := make([]int64, partitions)
		l.mu.Lock()
		for p := range offs {
			offs[p] = -1
			if n, ok := l.next[p]; ok {
				offs[p] = n
			}
		}
		l.mu.Unlock()
		if cond(offs) {
			return
		}
		select {
		case <-l.changed:
		case <-deadline.C:
			tb.Fatalf("timed out waiting for the consumers to commit: offsets %v", offs)
		}
	}
}

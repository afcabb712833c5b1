package consumer_test

import (
	"context"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
)

// A broker whose answers arrive late (busy, or a region away) must not stall a partition:
// the partition reader waits FetchMaxWait plus FetchAnswerMargin for a fetch's answer.
// With the reader's deadline at FetchMaxWait alone (250 ms, of which kafka-go gave the
// broker 187 ms), every answer 300 ms away failed, and the reader reconnected, backed off
// and fetched the same offset again, for ever: nothing was ever applied.
func TestFetchAnswersArrivingLateDoNotStallAPartition(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	cfg := b.config()
	const delay = 300 * time.Millisecond
	cfg.Dialer = &kafka.Dialer{
		Timeout: 10 * time.Second,
		DialFunc: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return newLateConn(c, delay), nil
		},
	}
	start(t, b.db, cfg)

	var first []kafka.Message
	for _, id := range ids("late-a", 20) {
		first = append(first, msg(id, 0, ""))
	}
	produce(t, b.brokers, b.topic, first...)
	b.waitCommitted(t, 30*time.Second, func(offs []int64) bool { return offs[0] == 20 })

	// The partition is idle now: its fetches wait FetchMaxWait on the broker, then take
	// the delay to come back. Records produced meanwhile are still applied.
	time.Sleep(2 * time.Second)
	var second []kafka.Message
	for _, id := range ids("late-b", 10) {
		second = append(second, msg(id, 0, ""))
	}
	produce(t, b.brokers, b.topic, second...)
	b.waitCommitted(t, 30*time.Second, func(offs []int64) bool { return offs[0] == 30 })
	require.Equal(t, 30, b.effects(t))
	require.Equal(t, 30, b.distinctEffects(t))
}

// lateConn hands over what the broker sends delay after it arrived, and honours the read
// deadline the client sets, as a connection to a distant broker does.
type lateConn struct {
	net.Conn
	delay  time.Duration
	chunks chan lateChunk

	mu       sync.Mutex // deadline
	deadline time.Time

	readMu sync.Mutex // the fields below: one Read at a time
	head   *lateChunk
	rest   []byte
}

type lateChunk struct {
	b   []byte
	at  time.Time
	err error
}

func newLateConn(c net.Conn, delay time.Duration) *lateConn {
	l := &lateConn{Conn: c, delay: delay, chunks: make(chan lateChunk, 4096)}
	go func() {
		for {
			buf := make([]byte, 64<<10)
			n, err := c.Read(buf)
			if n > 0 {
				l.chunks <- lateChunk{b: buf[:n], at: time.Now()}
			}
			if err != nil {
				l.chunks <- lateChunk{err: err, at: time.Now()}
				return
			}
		}
	}()
	return l
}

func (l *lateConn) Read(p []byte) (int, error) {
	l.readMu.Lock()
	defer l.readMu.Unlock()
	if len(l.rest) > 0 {
		n := copy(p, l.rest)
		l.rest = l.rest[n:]
		return n, nil
	}
	l.mu.Lock()
	deadline := l.deadline
	l.mu.Unlock()
	var expired <-chan time.Time
	if !deadline.IsZero() {
		timer := time.NewTimer(time.Until(deadline))
		defer timer.Stop()
		expired = timer.C
	}
	if l.head == nil {
		select {
		case c := <-l.chunks:
			l.head = &c
		case <-expired:
			return 0, os.ErrDeadlineExceeded
		}
	}
	// The chunk stays at the head until it is due, so a deadline loses nothing.
	if wait := time.Until(l.head.at.Add(l.delay)); wait > 0 {
		due := time.NewTimer(wait)
		defer due.Stop()
		select {
		case <-due.C:
		case <-expired:
			return 0, os.ErrDeadlineExceeded
		}
	}
	c := l.head
	l.head = nil
	if c.err != nil {
		return 0, c.err
	}
	n := copy(p, c.b)
	l.rest = c.b[n:]
	return n, nil
}

func (l *lateConn) SetDeadline(t time.Time) error {
	l.mu.Lock()
	l.deadline = t
	l.mu.Unlock()
	return l.Conn.SetWriteDeadline(t)
}

func (l *lateConn) SetReadDeadline(t time.Time) error {
	l.mu.Lock()
	l.deadline = t
	l.mu.Unlock()
	return nil
}

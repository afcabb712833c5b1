package consumer

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"testing"

	"github.com/sirupsen/logrus"
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

// answerSource is a brokerSource whose Receive returns answers of ten messages of one
// ordered lane, numbered in the order the answers were taken, to several pollers at once.
type answerSource struct {
	mu      sync.Mutex
	next    int
	answers int
}

func (s *answerSource) Receive(ctx context.Context) ([]*brokerMessage, error) {
	s.mu.Lock()
	if s.next == s.answers*10 {
		s.mu.Unlock()
		<-ctx.Done()
		return nil, ctx.Err()
	}
	msgs := make([]*brokerMessage, 10)
	for i := range msgs {
		msgs[i] = &brokerMessage{ID: strconv.Itoa(s.next), Ordered: true, Lane: "g"}
		s.next++
	}
	s.mu.Unlock()
	runtime.Gosched() // let another poller overtake this one between Receive and the hand-over
	return msgs, nil
}

func (*answerSource) Ack(context.Context, []*brokerMessage) error     { return nil }
func (*answerSource) Release(context.Context, []*brokerMessage) error { return nil }
func (*answerSource) Close() error                                    { return nil }

// TestReceiveHandsOverWholeAnswers: with several SQS pollers, each poller's answer reaches
// the collector whole, and in the order of the receipt numbers: what a lane's order rests on
// (SQS never hands one FIFO group's messages to two calls in flight).
func TestReceiveHandsOverWholeAnswers(t *testing.T) {
	const answers = 400
	src := &answerSource{answers: answers}
	b := &brokerRun{
		c:   &Consumer{cfg: Config{Name: "handover", SQS: &SQS{Queue: "q"}, Receivers: 8}},
		src: src, log: logrus.NewEntry(logrus.New()), lanes: newLanes(),
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	in := make(chan *record, 3) // small: pollers block mid-answer
	go b.receive(ctx, in)
	var got []*record
	for len(got) < answers*10 {
		got = append(got, <-in)
	}
	cancel()
	for range in {
	}
	for i := 0; i < len(got); i += 10 {
		first, _ := strconv.Atoi(got[i].broker.ID)
		require.Zero(t, first%10, "record %d starts an answer", i)
		for j := range 10 {
			r := got[i+j]
			require.Equal(t, strconv.Itoa(first+j), r.broker.ID, "an answer is handed over whole, in its order")
			if i+j > 0 {
				require.Greater(t, r.seq, got[i+j-1].seq, "numbered in the order of in")
			}
		}
	}
}

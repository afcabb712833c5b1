package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/idemd/idemd/internal/collect"
	"github.com/idemd/idemd/internal/metrics"
)

// The Pub/Sub and SQS doors. Receivers receive from the brokerSource (Pub/Sub: one goroutine
// draining the client's Receivers streams; SQS: Receivers ReceiveMessage pollers) and hand
// the messages, numbered in order of receipt, to a collector that cuts batches (BatchSize,
// Linger) as slots free up. Each batch runs in a goroutine of its own, at most BatchesInFlight at once,
// through the same unit of work as Kafka's batches (process), and is acknowledged only after
// its transaction committed. Lanes (an ordering key, a FIFO group) keep their order: a batch
// waits for the earlier batches that hold messages of its lanes. When a batch fails, its
// messages are released for redelivery, and so are the messages received before the release
// that wait behind them in their lanes: applying those would overtake the released ones.

// errSourceStopped marks a source that stopped for good (a Pub/Sub streaming pull that
// failed permanently, such as a missing subscription): Run fails with it.
var errSourceStopped = errors.New("subscription stopped")

// runBroker is Run for a Pub/Sub or SQS subscription.
func (c *Consumer) runBroker(ctx context.Context) error {
	src, err := c.openSource(ctx)
	if err != nil {
		return fmt.Errorf("consumer %s: %w", c.cfg.Name, err)
	}
	door, source := c.cfg.Door(), c.cfg.source()
	log := c.log.WithField("door", door).WithField("topic", source)
	log.Info("consumer started")

	scope := c.newRunScope(ctx)
	defer scope.close()
	if door == DoorSQS {
		stop := c.watchBacklog(scope.failed)
		defer stop()
	}

	b := &brokerRun{c: c, src: src, log: log, work: scope.work, lanes: newLanes()}
	b.report = func(err error) {
		b.fatal.Store(true)
		scope.report(err)
	}
	in := make(chan *record, c.cfg.BatchSize)
	go b.receive(scope.failed, in)
	sem := make(chan struct{}, c.cfg.BatchesInFlight)
	var wg sync.WaitGroup
	for {
		// A batch is cut once a slot is free: while every slot is taken, the messages
		// received meanwhile wait in in, and the next batch takes them (up to BatchSize).
		sem <- struct{}{}
		batch, open := collect.Batch(in, c.cfg.BatchSize, c.cfg.Linger, nil)
		if len(batch) == 0 {
			<-sem
		} else {
			wait, done := b.lanes.enqueue(batch)
			wg.Go(func() {
				defer func() { <-sem }()
				defer b.lanes.finish(batch, done)
				for _, w := range wait {
					<-w
				}
				b.apply(batch)
			})
		}
		if !open {
			break
		}
	}
	wg.Wait()
	// Releases what is still held: received and not handed over, or left by a failure.
	if err := src.Close(); err != nil {
		log.WithError(err).Warn("error releasing the messages still held; they come back when their lease ends")
	}
	if scope.err != nil {
		log.WithError(scope.err).Error("consumer stopped")
		return scope.err
	}
	log.Info("consumer drained and stopped")
	return nil
}

// openSource opens the subscription's brokerSource.
func (c *Consumer) openSource(ctx context.Context) (brokerSource, error) {
	switch c.cfg.Door() {
	case DoorPubSub:
		if c.cfg.PubSubClient == nil {
			return nil, errors.New("PubSubClient is required to run a Pub/Sub subscription")
		}
		return newPubSubSource(c.cfg.PubSubClient, pubsubSourceConfig{
			Subscription: c.cfg.PubSub.name(), MaxOutstanding: max(pubsubMaxOutstandingDefault, 2*c.cfg.BatchSize),
			MaxExtension: c.cfg.MaxLease, ExtensionPeriod: c.cfg.Lease, ReceiveMax: c.cfg.BatchSize,
			Streams: c.cfg.Receivers,
		})
	case DoorSQS:
		if c.cfg.SQSClient == nil {
			return nil, errors.New("SQSClient is required to run an SQS subscription")
		}
		return newSQSSource(ctx, c.cfg.SQSClient, sqsSourceConfig{Queue: c.cfg.SQS.Queue, Visibility: c.cfg.Lease, MaxExtension: c.cfg.MaxLease})
	}
	return nil, fmt.Errorf("door %s has no broker source", c.cfg.Door())
}

// brokerRun is one Run of a Pub/Sub or SQS subscription.
type brokerRun struct {
	c      *Consumer
	src    brokerSource
	log    *logrus.Entry
	work   context.Context // the batches' transactions: ends ShutdownTimeout after Run's ctx
	report func(error)     // fails Run
	fatal  atomic.Bool     // Run failed: apply nothing more
	lanes  *lanes
}

// receive hands the source's messages to in, in order of receipt, until ctx ends; then it
// closes in. Messages received and not handed over stay held, and Close releases them.
//
// A Pub/Sub source is drained by one goroutine (its streams are the client's). An SQS source
// is polled by Receivers goroutines, each a ReceiveMessage call in flight. Each poller numbers
// and hands over what one call returned as a whole, under handOff, so that in's order is the
// order of the numbers. That is a lane's order: SQS does not hand out a FIFO group's next
// messages while earlier ones are in flight (received and neither deleted nor visible again),
// so two calls in flight never hold messages of one lane, and the later messages of a lane
// come only after the earlier ones were numbered, applied and deleted.
func (b *brokerRun) receive(ctx context.Context, in chan<- *record) {
	defer close(in)
	pollers := 1
	if b.c.cfg.Door() == DoorSQS {
		pollers = b.c.cfg.Receivers
	}
	var (
		handOff sync.Mutex
		wg      sync.WaitGroup
	)
	for range pollers {
		wg.Go(func() { b.poll(ctx, in, &handOff) })
	}
	wg.Wait()
}

// poll is one receiving goroutine of receive.
func (b *brokerRun) poll(ctx context.Context, in chan<- *record, handOff *sync.Mutex) {
	door, source := b.c.cfg.Door(), b.c.cfg.source()
	backoff := time.Second
	for {
		msgs, err := b.src.Receive(ctx)
		if err != nil {
			switch {
			case ctx.Err() != nil:
				return
			case errors.Is(err, errSourceStopped):
				b.report(err)
				return
			}
			b.log.WithError(err).Warn("error receiving messages; retrying")
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 30*time.Second)
			continue
		}
		backoff = time.Second
		metrics.Received.WithLabelValues(b.c.cfg.Name, door).Add(float64(len(msgs)))
		if !b.handOver(ctx, in, handOff, door, source, msgs) {
			return
		}
	}
}

// handOver numbers msgs and sends them to in, all of them before any other poller's; false
// when ctx ended first.
func (b *brokerRun) handOver(ctx context.Context, in chan<- *record, handOff *sync.Mutex, door, source string, msgs []*brokerMessage) bool {
	handOff.Lock()
	defer handOff.Unlock()
	for _, m := range msgs {
		r := newBrokerRecord(b.c.cfg.Name, door, source, m)
		b.lanes.number(r)
		select {
		case in <- r:
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// apply applies a batch once the earlier batches of its lanes finished, and acknowledges it
// after its transaction committed. On failure it releases the batch (and its lanes' held
// messages), and fails Run unless the failure is the shutdown timeout.
func (b *brokerRun) apply(batch []*record) {
	if b.fatal.Load() {
		return // Run failed: Close releases the batch
	}
	keep, behind := b.lanes.split(batch)
	if len(behind) > 0 {
		b.log.WithField("messages", len(behind)).Debug("released behind a released message of their lane")
		b.release(behind)
	}
	if len(keep) == 0 {
		return
	}
	if err := b.c.process(b.work, keep); err != nil {
		b.release(keep)
		if b.work.Err() == nil {
			b.report(fmt.Errorf("error applying a batch of %s: %w", b.c.cfg.source(), err))
		} else {
			b.log.WithField("messages", len(keep)).Warn("shutdown timeout: batch rolled back, released for redelivery")
		}
		return
	}
	msgs := brokerMessages(keep)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(b.work), 30*time.Second)
	defer cancel()
	if err := b.src.Ack(ctx, msgs); err != nil {
		// Those messages come again, and their ids deduplicate them.
		b.log.WithError(err).WithField("messages", len(msgs)).Warn("acknowledgement not confirmed; the broker may redeliver")
		return
	}
	if b.c.cfg.OnAck != nil {
		out := make([]Message, len(keep))
		for i, r := range keep {
			out[i] = r.msg
		}
		b.c.cfg.OnAck(out)
	}
}

// release gives the records back to the broker and breaks their ordered lanes: the
// messages of those lanes received until now are released too, not applied (split).
func (b *brokerRun) release(recs []*record) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(b.work), 30*time.Second)
	defer cancel()
	if err := b.src.Release(ctx, brokerMessages(recs)); err != nil {
		b.log.WithError(err).Warn("error releasing messages; they come back when their lease ends")
	}
	b.lanes.breakAfter(recs)
}

func brokerMessages(recs []*record) []*brokerMessage {
	out := make([]*brokerMessage, len(recs))
	for i, r := range recs {
		out[i] = r.broker
	}
	return out
}

// lanes keeps the order of ordered lanes across the batches in flight.
type lanes struct {
	mu  sync.Mutex
	seq uint64 // the last number given at receipt
	// tail is the done channel of the last batch enqueued with messages of a lane.
	tail map[string]chan struct{}
	// broken maps a lane to the last receipt number when one of its messages was
	// released: its messages received until then are released, not applied.
	broken map[string]uint64
}

func newLanes() *lanes {
	return &lanes{tail: map[string]chan struct{}{}, broken: map[string]uint64{}}
}

// number numbers r in order of receipt.
func (l *lanes) number(r *record) {
	l.mu.Lock()
	l.seq++
	r.seq = l.seq
	l.mu.Unlock()
}

// enqueue registers batch, in order of receipt, as the last one of its ordered lanes; it
// returns the done channels of the earlier batches of those lanes, which must finish first,
// and the batch's own, which finish closes.
func (l *lanes) enqueue(batch []*record) (wait []chan struct{}, done chan struct{}) {
	done = make(chan struct{})
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range batch {
		if !r.broker.Ordered {
			continue
		}
		lane := r.broker.Lane
		if prev, ok := l.tail[lane]; ok && prev != done {
			wait = append(wait, prev)
		}
		l.tail[lane] = done
	}
	return wait, done
}

// finish closes done and forgets it as the tail of the batch's lanes.
func (l *lanes) finish(batch []*record, done chan struct{}) {
	l.mu.Lock()
	for _, r := range batch {
		if r.broker.Ordered && l.tail[r.broker.Lane] == done {
			delete(l.tail, r.broker.Lane)
		}
	}
	l.mu.Unlock()
	close(done)
}

// split sorts a batch into the records to apply and those behind a released message of
// their lane.
func (l *lanes) split(batch []*record) (keep, behind []*record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.broken) == 0 {
		return batch, nil
	}
	for _, r := range batch {
		if r.broker.Ordered {
			if until, ok := l.broken[r.broker.Lane]; ok {
				if r.seq <= until {
					behind = append(behind, r)
					continue
				}
				delete(l.broken, r.broker.Lane) // received after the release: in order again
			}
		}
		keep = append(keep, r)
	}
	return keep, behind
}

// breakAfter marks the ordered lanes of released records: what was received of them until
// now (the release done) waits behind a message that comes again.
func (l *lanes) breakAfter(released []*record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range released {
		if r.broker.Ordered {
			l.broken[r.broker.Lane] = l.seq
		}
	}
}

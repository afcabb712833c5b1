package consumer

import (
	"context"
	"sync"
	"time"
)

// runScope is what both kinds of Run (Kafka's, and Pub/Sub's and SQS's) share: the work
// context, which outlives Run's ctx by at most ShutdownTimeout so that the batches in hand
// drain, and the fail context, which the first failure reported ends; Run returns that
// failure.
type runScope struct {
	// work is the batches' transactions' context.
	work context.Context
	// failed ends with Run's ctx or at the first report.
	failed context.Context
	// close releases the contexts; call it when Run returns.
	close func()

	errOnce sync.Once
	err     error
	fail    context.CancelCauseFunc
}

func (c *Consumer) newRunScope(ctx context.Context) *runScope {
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	stopDrainTimer := context.AfterFunc(ctx, func() { time.AfterFunc(c.cfg.ShutdownTimeout, cancelWork) })
	failed, fail := context.WithCancelCause(ctx)
	return &runScope{work: work, failed: failed, fail: fail, close: func() {
		fail(nil)
		stopDrainTimer()
		cancelWork()
	}}
}

// report records the first failure and ends failed.
func (s *runScope) report(err error) {
	s.errOnce.Do(func() { s.err = err })
	s.fail(err)
}

// Package testsignal lets a component tell a test that something happened — a relay round
// finished, a delivery was recorded, the daemon is ready — so that the test waits for
// exactly that event instead of polling for its effects. Modelled on riverqueue/river's
// rivershared/testsignal.
//
// Guarantee: a Signal whose Init was never called (every use outside tests) costs one nil
// check and never blocks; an initialised one never blocks the component either (a full
// buffer fails the test instead).
package testsignal

import "time"

// capacity bounds the values buffered for a test. A component signals at most once per unit
// of work (a round, an attempt), so a test that waits for one in a thousand still never
// makes it block.
const capacity = 1000

// WaitTimeout bounds every wait: it is a safety net against a hung test, not a timing
// assertion, so it is generous.
const WaitTimeout = 60 * time.Second

// TB is the part of testing.TB a signal uses (production code does not import testing).
type TB interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// Signal carries values of type T from a component to a test. Its zero value is inert.
type Signal[T any] struct {
	ch chan T
	tb TB
}

// Init makes the signal deliver values to the test; call it before the component starts.
func (s *Signal[T]) Init(tb TB) {
	s.ch = make(chan T, capacity)
	s.tb = tb
}

// Signal sends v to the test, if one initialised the signal; else it does nothing.
func (s *Signal[T]) Signal(v T) {
	if s.ch == nil {
		return
	}
	select {
	case s.ch <- v:
	default: // never block the component
		s.tb.Errorf("testsignal: buffer of %d values full; the test does not read this signal", capacity)
	}
}

// C is the channel of values, for tests that select on several signals.
func (s *Signal[T]) C() <-chan T {
	if s.ch == nil {
		panic("testsignal: Signal not initialised; call Init in the test first")
	}
	return s.ch
}

// Wait returns the next value, or fails the test after WaitTimeout.
func (s *Signal[T]) Wait(tb TB) T {
	tb.Helper()
	return s.WaitFor(tb, "a signal", func(T) bool { return true })
}

// WaitFor reads values until one satisfies ok and returns it, or fails the test after
// WaitTimeout, saying what it waited for. The values read before are dropped.
func (s *Signal[T]) WaitFor(tb TB, what string, ok func(T) bool) T {
	tb.Helper()
	timer := time.NewTimer(WaitTimeout)
	defer timer.Stop()
	var (
		seen int
		last T
	)
	for {
		select {
		case v := <-s.C():
			if ok(v) {
				return v
			}
			seen, last = seen+1, v
		case <-timer.C:
			if seen == 0 {
				tb.Fatalf("testsignal: waited %s for %s; no signal came", WaitTimeout, what)
			} else {
				tb.Fatalf("testsignal: waited %s for %s; %d other signals came, the last %+v", WaitTimeout, what, seen, last)
			}
			return last
		}
	}
}

// RequireNone fails the test if a value is waiting.
func (s *Signal[T]) RequireNone(tb TB) {
	tb.Helper()
	select {
	case v := <-s.C():
		tb.Errorf("testsignal: expected no signal, got %+v", v)
	default:
	}
}

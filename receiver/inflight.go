package receiver

import (
	"sync"

	"github.com/idemd/idemd/exactlyonce"
)

// inFlight holds the dedup keys of the webhooks this receiver has handed to the batcher and
// not yet answered. A webhook whose key is among them (a sender's retry while the first
// delivery is still in its transaction, or a provider that sends twice at once) waits for
// that delivery before it goes to a batch: in a batch, its claim would wait on the first's
// uncommitted row and hold up every other webhook of its batch, and with a few such retries
// every worker, for as long as the first's effect runs. Once the first is answered, the
// retry's claim finds its record and it is answered a duplicate at once (or, when the first
// failed and stored nothing, it is applied). Another replica's retry is not seen here: its
// claim still waits in its batch.
type inFlight struct {
	mu   sync.Mutex
	keys map[flightKey]*item
}

type flightKey struct{ scope, id string }

// enter registers it under m's keys (its own and its Also ones) and returns nil, or returns
// a webhook still in flight under one of them, for it to wait for and then enter again.
func (f *inFlight) enter(it *item, m *exactlyonce.Message) *item {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.keys == nil {
		f.keys = make(map[flightKey]*item)
	}
	if first := f.holder(flightKey{m.Scope, m.ID}); first != nil {
		return first
	}
	for _, k := range m.Also {
		if first := f.holder(flightKey{k.Scope, k.ID}); first != nil {
			return first
		}
	}
	f.keys[flightKey{m.Scope, m.ID}] = it
	for _, k := range m.Also {
		f.keys[flightKey{k.Scope, k.ID}] = it
	}
	return nil
}

// holder is the webhook in flight under k, if it has not been answered yet (one that was is
// about to leave). f.mu is held.
func (f *inFlight) holder(k flightKey) *item {
	it, ok := f.keys[k]
	if !ok {
		return nil
	}
	select {
	case <-it.done:
		return nil
	default:
		return it
	}
}

// leave removes the keys that it holds under m (another webhook may hold them already: one
// that entered once it was answered).
func (f *inFlight) leave(it *item, m *exactlyonce.Message) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.drop(flightKey{m.Scope, m.ID}, it)
	for _, k := range m.Also {
		f.drop(flightKey{k.Scope, k.ID}, it)
	}
}

func (f *inFlight) drop(k flightKey, it *item) {
	if f.keys[k] == it {
		delete(f.keys, k)
	}
}

package deadletter

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemd/idemd/internal/metrics"
)

// ReplayFunc replays one letter inside tx — runs its effect again through its door, or
// puts its event back in the outbox — and says what it did. When it fails, nothing of the
// replay commits.
type ReplayFunc func(ctx context.Context, tx pgx.Tx, l *Letter) (Replayed, error)

// Replayed is what a ReplayFunc did with its letter: data the Replayer counts once the
// replay committed, and reports.
type Replayed struct {
	// Outcome is what the replay did. Required: a replay without one fails.
	Outcome ReplayOutcome
	// Done says it in a few words for the operator (through which door, with which
	// operation id).
	Done string
}

// ReplayOutcome is what a replay did with its letter: the outcome label of
// idemd_dead_letters_replayed_total.
type ReplayOutcome string

// The outcomes of a replay.
const (
	// ReplayApplied: the message's effect ran again. It counts as processed
	// (idemd_messages_processed_total), as a message that arrives and is applied does.
	ReplayApplied ReplayOutcome = "applied"
	// ReplayStale: the stale-event guard skipped the message's effect (a newer message of its
	// entity was applied meanwhile). It counts as stale (idemd_messages_stale_total).
	ReplayStale ReplayOutcome = "stale"
	// ReplayRequeued: the letter's outbound event goes back to the relay (DoorRelay) or the
	// deliverer (DoorDelivery), which count it when they publish or deliver it.
	ReplayRequeued ReplayOutcome = "requeued"
)

func (o ReplayOutcome) known() bool {
	return o == ReplayApplied || o == ReplayStale || o == ReplayRequeued
}

// counters are the series a committed replay of a letter of door and pipeline with outcome o
// adds one to: the replays', and the processed or stale messages' of the pipeline.
func counters(door Door, pipeline string, o ReplayOutcome) []prometheus.Counter {
	cs := []prometheus.Counter{metrics.DeadLettersReplayed.WithLabelValues(pipeline, string(door), string(o))}
	switch o {
	case ReplayApplied:
		cs = append(cs, metrics.Processed.WithLabelValues(pipeline))
	case ReplayStale:
		cs = append(cs, metrics.Stale.WithLabelValues(pipeline))
	}
	return cs
}

// ErrNoReplayer: no door registered how to replay the letter (its pipeline is not
// configured, or the process runs without that door).
var ErrNoReplayer = errors.New("no door replays this dead letter")

// Replayer replays any letter through the door that wrote it: each door registers how its
// letters are replayed, and Replay is one call for every kind. Guarantee: a letter is
// replayed at most once (Store.Replay): its replay and its replayed mark commit together,
// and the replay is counted in the metrics after that commit, never before.
type Replayer struct {
	pool  *pgxpool.Pool
	store *Store
	mu    sync.RWMutex
	funcs map[route]ReplayFunc
}

type route struct {
	door     Door
	pipeline string
}

// NewReplayer returns a Replayer of store's letters on pool, with no door registered.
func NewReplayer(pool *pgxpool.Pool, store *Store) *Replayer {
	return &Replayer{pool: pool, store: store, funcs: map[route]ReplayFunc{}}
}

// Register says how letters of door are replayed. With pipeline "", fn replays the door's
// letters of every pipeline that has no function of its own. Registering again replaces.
func (r *Replayer) Register(door Door, pipeline string, fn ReplayFunc) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.funcs[route{door, pipeline}] = fn
}

func (r *Replayer) lookup(l *Letter) ReplayFunc {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if fn := r.funcs[route{l.Origin.Door, l.Pipeline}]; fn != nil {
		return fn
	}
	return r.funcs[route{l.Origin.Door, ""}]
}

// Expect creates at 0 the series that replays of door's letters of pipeline with outcomes
// count in, before any replay: a series born at its first increment hides that increment
// from rate() and increase(), so a bulk replay within one scrape interval would not show at
// all. Doors call it for the pipelines they know (RegisterReplay).
func (r *Replayer) Expect(door Door, pipeline string, outcomes ...ReplayOutcome) {
	for _, o := range outcomes {
		counters(door, pipeline, o)
	}
}

// Replay replays letter id through its door, exactly once, and returns what the door did.
// It fails with ErrAlreadyReplayed for a letter replayed before, ErrNotFound for an unknown
// id, ErrNoReplayer when no door registered the letter's origin, or the door's error; in
// each case nothing changed, and nothing is counted. A replay that commits is counted in
// idemd_dead_letters_replayed_total and, by its outcome, in the pipeline's processed or
// stale messages. It returns what the door did (Replayed: its outcome and, in words, how).
func (r *Replayer) Replay(ctx context.Context, id int64) (Replayed, error) {
	var (
		letter *Letter
		done   Replayed
	)
	err := r.store.Replay(ctx, r.pool, id, func(ctx context.Context, tx pgx.Tx, l *Letter) error {
		fn := r.lookup(l)
		if fn == nil {
			return fmt.Errorf("dead letter %d (door %s, pipeline %q): %w", id, l.Origin.Door, l.Pipeline, ErrNoReplayer)
		}
		var err error
		if done, err = fn(ctx, tx, l); err != nil {
			return err
		}
		if !done.Outcome.known() {
			return fmt.Errorf("dead letter %d (door %s, pipeline %q): the replay reported no known outcome (%q)", id, l.Origin.Door, l.Pipeline, done.Outcome)
		}
		letter = l
		return nil
	})
	if err != nil {
		return Replayed{}, err
	}
	// Only now: the replay's transaction committed.
	for _, c := range counters(letter.Origin.Door, letter.Pipeline, done.Outcome) {
		c.Inc()
	}
	return done, nil
}

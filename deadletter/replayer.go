package deadletter

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ReplayFunc replays one letter inside tx — runs its effect again through its door, or
// puts its event back in the outbox — and says in a few words what it did. When it fails,
// nothing of the replay commits.
type ReplayFunc func(ctx context.Context, tx pgx.Tx, l *Letter) (string, error)

// ErrNoReplayer: no door registered how to replay the letter (its pipeline is not
// configured, or the process runs without that door).
var ErrNoReplayer = errors.New("no door replays this dead letter")

// Replayer replays any letter through the door that wrote it: each door registers how its
// letters are replayed, and Replay is one call for every kind. Guarantee: a letter is
// replayed at most once (Store.Replay): its replay and its replayed mark commit together.
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

// Replay replays letter id through its door, exactly once, and returns what the door did.
// It fails with ErrAlreadyReplayed for a letter replayed before, ErrNotFound for an unknown
// id, ErrNoReplayer when no door registered the letter's origin, or the door's error; in
// each case nothing changed.
func (r *Replayer) Replay(ctx context.Context, id int64) (string, error) {
	var what string
	err := r.store.Replay(ctx, r.pool, id, func(ctx context.Context, tx pgx.Tx, l *Letter) error {
		fn := r.lookup(l)
		if fn == nil {
			return fmt.Errorf("dead letter %d (door %s, pipeline %q): %w", id, l.Origin.Door, l.Pipeline, ErrNoReplayer)
		}
		var err error
		what, err = fn(ctx, tx, l)
		return err
	})
	return what, err
}

package outbox

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Wake names the listeners a committed outbox write must wake: the relay (rows for a
// topic) and the HTTP deliverers (rows for an endpoint).
type Wake uint8

const (
	// WakeRelay: rows for the relay were written.
	WakeRelay Wake = 1 << iota
	// WakeDeliverers: http_deliveries rows were written.
	WakeDeliverers
)

// notifyTimeout bounds one NOTIFY sent after a commit. A notification that does not go out
// only delays the listeners until their next poll.
const notifyTimeout = 5 * time.Second

// notifier sends the NOTIFYs of commits made elsewhere, outside their transactions: at
// most one statement in flight per store, and whatever commits meanwhile is folded into
// the next one. Under load this is one NOTIFY per round trip, not one per transaction.
//
// Why not NOTIFY in the writing transaction (as EnqueueTx does): PostgreSQL makes every
// notifying transaction take one cluster-wide lock before its commit record and hold it
// until the commit is flushed (async.c, PreCommit_Notify), so concurrent notifying
// transactions commit one after another, one WAL flush each, instead of sharing flushes.
// On the bench's machine that capped 16 connections of one-insert transactions at 550-900
// commits/s, against 2,000-2,900 without the NOTIFY. The NOTIFY here runs in its own
// statement with synchronous_commit off, so it holds that lock only for the time of the
// statement, never for a flush.
type notifier struct {
	mu      sync.Mutex
	pending Wake
	running bool
}

// Notify wakes the listeners in w of s's schema, after a commit that wrote outbox rows
// without notifying (QueueQuiet). It does not block: the NOTIFY is sent by a goroutine,
// coalesced with those of other commits. A NOTIFY that fails is not retried: the relay
// and the deliverers poll anyway (RelayConfig.PollInterval).
func (s *Store) Notify(pool *pgxpool.Pool, w Wake) {
	if w == 0 || pool == nil {
		return
	}
	n := s.notifier
	n.mu.Lock()
	n.pending |= w
	if n.running {
		n.mu.Unlock()
		return
	}
	n.running = true
	n.mu.Unlock()
	go s.sendNotifications(pool)
}

// sendNotifications sends what is pending until nothing is.
func (s *Store) sendNotifications(pool *pgxpool.Pool) {
	n := s.notifier
	for {
		n.mu.Lock()
		w := n.pending
		n.pending = 0
		if w == 0 {
			n.running = false
			n.mu.Unlock()
			return
		}
		n.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), notifyTimeout)
		_, _ = pool.Exec(ctx, s.notifySQL[w&(WakeRelay|WakeDeliverers)], s.notifyArgs(w)...)
		cancel()
	}
}

func (s *Store) notifyArgs(w Wake) []any {
	var args []any
	if w&WakeRelay != 0 {
		args = append(args, s.channel)
	}
	if w&WakeDeliverers != 0 {
		args = append(args, s.deliveryChannel)
	}
	return args
}

// notifyStatements are the NOTIFY statements of Notify, indexed by Wake: synchronous_commit
// is turned off for that statement's own transaction only (set_config's is_local).
func notifyStatements() [4]string {
	const prefix = `SELECT set_config('synchronous_commit', 'off', true)`
	return [4]string{
		WakeRelay:                  prefix + `, pg_notify($1, '')`,
		WakeDeliverers:             prefix + `, pg_notify($1, '')`,
		WakeRelay | WakeDeliverers: prefix + `, pg_notify($1, ''), pg_notify($2, '')`,
	}
}

// NotifyTx wakes the listeners in w when tx commits (a NOTIFY inside tx), for a caller
// that does not commit tx itself. See notifier for what that costs at commit.
func (s *Store) NotifyTx(ctx context.Context, tx pgx.Tx, w Wake) error {
	if w == 0 {
		return nil
	}
	var b pgx.Batch
	s.queueNotify(&b, w)
	if err := tx.SendBatch(ctx, &b).Close(); err != nil {
		return fmt.Errorf("error notifying the outbox listeners: %w", err)
	}
	return nil
}

// queueNotify adds the in-transaction NOTIFYs of w to batch.
func (s *Store) queueNotify(batch *pgx.Batch, w Wake) {
	if w&WakeRelay != 0 {
		batch.Queue("SELECT pg_notify($1, '')", s.channel)
	}
	if w&WakeDeliverers != 0 {
		batch.Queue("SELECT pg_notify($1, '')", s.deliveryChannel)
	}
}

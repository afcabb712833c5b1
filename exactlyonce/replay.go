package exactlyonce

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/processed"
)

// ReplayTx applies a dead-lettered message again inside tx, the replay transaction that
// holds its letter's lock (deadletter.Replayer): its guard, its effect and its events run
// exactly as when it was first delivered, with no retry and no savepoint, so that a failure
// fails the replay and commits nothing. With claim set, m's key is claimed first, as a
// delivered message's would be: a letter written before the message had a usable id is
// replayed under the id found now, and only if that id is new.
//
// It returns what the replay did, for the Replayer to count once tx commits:
// deadletter.ReplayApplied, or deadletter.ReplayStale when the guard skipped the effect
// (m.Outcome says the same).
func (u *Unit) ReplayTx(ctx context.Context, tx pgx.Tx, m *Message, claim bool) (deadletter.ReplayOutcome, error) {
	m.Result = Result{}
	if m.Invalid != nil {
		return "", fmt.Errorf("message %q cannot be applied: %w", m.ID, m.Invalid)
	}
	if claim {
		res, err := u.cfg.Processed.ClaimBatchTx(ctx, tx, []processed.Claim{{
			Scope: m.Scope, MessageID: m.ID, Fingerprint: m.Fingerprint, Retention: m.Retention, Payload: m.Payload,
		}})
		if err != nil {
			return "", err
		}
		if err := res[0].Err(); err != nil {
			return "", fmt.Errorf("message id %q: %w", m.ID, err)
		}
	}
	m.Attempts = 1
	q := &queue{direct: true}
	if err := u.apply(ctx, tx, m, q); err != nil {
		return "", err
	}
	if !claim {
		// Its record said dead-lettered; the effect is applied now.
		if err := u.cfg.Processed.ReplayedTx(ctx, tx, m.Scope, m.ID); err != nil {
			return "", err
		}
	}
	// The replay's transaction is its caller's: the relay is notified at its commit.
	if err := u.outbox.NotifyTx(ctx, tx, q.wake); err != nil {
		return "", err
	}
	if m.Outcome == Stale {
		return deadletter.ReplayStale, nil
	}
	return deadletter.ReplayApplied, nil
}

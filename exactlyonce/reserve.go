package exactlyonce

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/internal/tracing"
	"github.com/idemd/idemd/processed"
)

// Reservations serve API requests (the Idempotency-Key contract), where a concurrent request
// with the same key must see the first one in flight instead of blocking on its uncommitted
// claim. The flow is two transactions:
//
//  1. Reserve commits an in-flight record with a lease, on its own;
//  2. ApplyReserved checks that reservation (processed.AcquireTx), runs the effect exactly as
//     Apply does (savepoints, MaxAttempts, the letter and the failure answer) and completes
//     the record in the same transaction, on condition that the lease token still holds
//     it. A transient failure releases the reservation so that a retry runs at once; a crash
//     leaves it to expire, and the next claimer with the same payload takes it over after
//     the lease.
//
// The guarantee is Apply's: the effect commits together with the completed record, or not at
// all; a reservation whose lease was taken over can no longer commit (processed.ErrLeaseLost).

// Reserve claims m with a committed reservation. It returns the lease token when the id was
// new (m.Outcome stays Pending); otherwise it sets m.Outcome to Duplicate, Conflict or
// InFlight with m.Record and m.Response, and returns uuid.Nil. A conflict is recorded. While
// the id is in flight, Reserve asks again until wait has passed (a client's "Prefer:
// wait=N"), backing off from 25 ms to 250 ms.
func (u *Unit) Reserve(ctx context.Context, m *Message, wait time.Duration) (uuid.UUID, error) {
	deadline := time.Now().Add(wait)
	poll := 25 * time.Millisecond
	for {
		token, err := u.reserve(ctx, m)
		if err != nil || m.Outcome != InFlight || !time.Now().Add(poll).Before(deadline) {
			return token, err
		}
		t := time.NewTimer(poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return uuid.Nil, ctx.Err()
		case <-t.C:
		}
		poll = min(poll*2, 250*time.Millisecond)
	}
}

func (u *Unit) reserve(ctx context.Context, m *Message) (uuid.UUID, error) {
	m.Result = Result{}
	var token uuid.UUID
	err := pgx.BeginFunc(ctx, u.pool, func(tx pgx.Tx) error {
		res, err := u.cfg.Processed.ClaimBatchTx(ctx, tx, []processed.Claim{{
			Scope: m.Scope, MessageID: m.ID, Fingerprint: m.Fingerprint, Retention: m.Retention, Payload: m.Payload, Reserve: true,
		}})
		if err != nil {
			return err
		}
		r := res[0]
		m.Record = r.Record
		switch r.Outcome {
		case processed.Claimed:
			token = r.LeaseToken
		case processed.Duplicate:
			m.Outcome = Duplicate
			if r.Record != nil {
				m.Response = r.Record.Response
			}
		case processed.Conflict:
			m.Outcome, m.ConflictCount = Conflict, r.ConflictCount
		default:
			m.Outcome = InFlight
		}
		return nil
	})
	if err != nil {
		return uuid.Nil, fmt.Errorf("error reserving message %q: %w", m.ID, err)
	}
	return token, nil
}

// ApplyReserved runs the effect of a message reserved with token, in one transaction that
// also completes its record (with its answer when m.Answer is set), and returns after the
// commit with m.Outcome Applied, Stale or DeadLettered. It makes one attempt: on a
// transient failure it releases the reservation and returns the error, for the caller to
// answer "retry later". processed.ErrLeaseLost means the lease ended and another claimer
// took the id over.
func (u *Unit) ApplyReserved(ctx context.Context, m *Message, token uuid.UUID) (err error) {
	ctx, span := u.startTx(ctx, []*Message{m})
	if span != nil {
		defer func() { tracing.End(span, err) }()
	}
	err = u.applyReserved(ctx, m, token)
	if err == nil || errors.Is(err, processed.ErrLeaseLost) {
		return err
	}
	// Nothing of the effect committed: give the id back so that the sender's retry runs now
	// rather than after the lease. Its own failure only delays that retry until the lease.
	relCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if rerr := pgx.BeginFunc(relCtx, u.pool, func(tx pgx.Tx) error {
		return u.cfg.Processed.ReleaseTx(relCtx, tx, m.Scope, m.ID, token)
	}); rerr != nil {
		err = errors.Join(err, rerr)
	}
	return err
}

func (u *Unit) applyReserved(ctx context.Context, m *Message, token uuid.UUID) (err error) {
	m.Result = Result{}
	tx, release, err := u.begin(ctx)
	if err != nil {
		return err
	}
	defer release()
	defer rollbackOnError(ctx, tx, &err)
	xid, err := u.cfg.Processed.AcquireXactTx(ctx, tx, m.Scope, m.ID, token)
	if err != nil {
		return err
	}
	// One message: a savepoint per attempt costs one round trip and spares a second
	// transaction when it fails.
	q := &queue{direct: true}
	if err := u.runCareful(ctx, tx, m, q); err != nil {
		return err
	}
	// The token makes the completion fail if the lease was taken over while the effect ran.
	c := completion(m)
	c.LeaseToken = token
	if err := u.cfg.Processed.CompleteBatchTx(ctx, tx, []processed.Completion{c}); err != nil {
		return err
	}
	if err := u.commit(ctx, tx, []*Message{m}, xid); err != nil {
		return err
	}
	u.outbox.Notify(u.pool, q.wake)
	return nil
}

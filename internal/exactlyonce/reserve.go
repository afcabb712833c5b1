package exactlyonce

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemd/idemd/processed"
)

// Reservations serve API requests (the Idempotency-Key contract), where a concurrent request
// with the same key must see the first one in flight instead of blocking on its uncommitted
// claim. The flow is two transactions:
//
//  1. Reserve commits an in-flight record with a lease, on its own;
//  2. ApplyReserved locks that reservation (processed.AcquireTx), runs the effect exactly as
//     Apply does (savepoints, MaxAttempts, DeadLetter) and completes the record in the same
//     transaction. A transient failure releases the reservation so that a retry runs at
//     once; a crash leaves it to expire, and the next claimer with the same payload takes it
//     over after the lease.
//
// The guarantee is Apply's: the effect commits together with the completed record, or not at
// all; a reservation whose lease was taken over can no longer commit (processed.ErrLeaseLost).

// Reserve claims m with a committed reservation. It returns the lease token when the id was
// new (m.Outcome stays Pending); otherwise it sets m.Outcome to Duplicate, Conflict or
// InFlight with m.Record and m.Response, and returns uuid.Nil. A conflict is recorded.
func (u *Unit) Reserve(ctx context.Context, m *Message) (uuid.UUID, error) {
	m.Outcome, m.Response, m.Record, m.ConflictCount, m.Attempts, m.Cause = Pending, nil, nil, 0, 0, nil
	var token uuid.UUID
	err := pgx.BeginFunc(ctx, u.pool, func(tx pgx.Tx) error {
		// The effect transaction holds the reservation's row lock (AcquireTx) until it
		// commits, and a claim waits for that lock: bound the wait, and answer from a
		// non-blocking read instead (below).
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+reserveLockWait+"'"); err != nil {
			return err
		}
		res, err := u.cfg.Processed.ClaimBatchTx(ctx, tx, []processed.Claim{{
			Scope: m.Scope, MessageID: m.ID, Fingerprint: m.Fingerprint, Retention: m.Retention, Reserve: true,
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
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "55P03" {
		return uuid.Nil, u.peek(ctx, m)
	}
	if err != nil {
		return uuid.Nil, fmt.Errorf("error reserving message %q: %w", m.ID, err)
	}
	return token, nil
}

// reserveLockWait bounds how long Reserve waits for a reservation's row lock.
const reserveLockWait = "100ms"

// peek answers a Reserve whose claim found the id locked by its effect transaction: plain
// reads never wait for row locks. A different fingerprint is a conflict even in flight, and
// is recorded like processed records conflicts.
func (u *Unit) peek(ctx context.Context, m *Message) error {
	schema := pgx.Identifier{u.cfg.Processed.Schema()}.Sanitize()
	var fp []byte
	err := u.pool.QueryRow(ctx, `SELECT fingerprint FROM `+schema+`.processed_messages WHERE scope = $1 AND message_id = $2`,
		m.Scope, m.ID).Scan(&fp)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && bytes.Equal(fp, m.Fingerprint)) {
		m.Outcome = InFlight
		return nil
	}
	if err != nil {
		return fmt.Errorf("error reading reservation of %q: %w", m.ID, err)
	}
	m.Outcome = Conflict
	err = u.pool.QueryRow(ctx, `INSERT INTO `+schema+`.conflicts AS c (scope, message_id, stored_fingerprint, incoming_fingerprint)
VALUES ($1, $2, $3, $4)
ON CONFLICT (scope, message_id, incoming_fingerprint)
DO UPDATE SET count = c.count + 1, last_seen_at = now()
RETURNING c.count`, m.Scope, m.ID, fp, m.Fingerprint).Scan(&m.ConflictCount)
	if err != nil {
		return fmt.Errorf("error recording conflict of %q: %w", m.ID, err)
	}
	return nil
}

// ApplyReserved runs the effect of a message reserved with token, in one transaction that
// also completes its record (with m.Response when m.StoreResponse), and returns after the
// commit with m.Outcome Applied or DeadLettered. It makes one attempt: on a transient failure
// it releases the reservation and returns the error, for the caller to answer "retry later".
// processed.ErrLeaseLost means the lease ended and another claimer took the id over.
func (u *Unit) ApplyReserved(ctx context.Context, m *Message, token uuid.UUID) error {
	err := u.applyReserved(ctx, m, token)
	if err == nil || errors.Is(err, processed.ErrLeaseLost) {
		return err
	}
	// Nothing of the effect committed: give the id back so that the sender's retry runs now
	// rather than after the lease. Its own failure only delays that retry until the lease.
	relCtx := context.WithoutCancel(ctx)
	if rerr := pgx.BeginFunc(relCtx, u.pool, func(tx pgx.Tx) error {
		return u.cfg.Processed.ReleaseTx(relCtx, tx, m.Scope, m.ID, token)
	}); rerr != nil {
		err = errors.Join(err, rerr)
	}
	return err
}

func (u *Unit) applyReserved(ctx context.Context, m *Message, token uuid.UUID) (err error) {
	m.Outcome, m.Response, m.Attempts, m.Cause = Pending, nil, 0, nil
	tx, err := u.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("error beginning transaction: %w", err)
	}
	defer func() {
		if err != nil {
			if rbErr := tx.Rollback(context.WithoutCancel(ctx)); rbErr != nil && !errors.Is(rbErr, pgx.ErrTxClosed) {
				err = errors.Join(err, fmt.Errorf("error rolling back: %w", rbErr))
			}
		}
	}()
	if err := u.cfg.Processed.AcquireTx(ctx, tx, m.Scope, m.ID, token); err != nil {
		return err
	}
	// One message: the savepoint costs one round trip and spares a second transaction.
	if err := u.run(ctx, tx, m, true); err != nil {
		return err
	}
	state := processed.StateDone
	if m.Outcome == DeadLettered {
		state = processed.StateDead
	}
	c := processed.Completion{Scope: m.Scope, MessageID: m.ID, State: state}
	if m.StoreResponse {
		c.Response = m.Response
	}
	if err := u.cfg.Processed.CompleteBatchTx(ctx, tx, []processed.Completion{c}); err != nil {
		return err
	}
	if u.cfg.BeforeCommit != nil {
		u.cfg.BeforeCommit([]*Message{m})
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("error committing reserved message: %w", err)
	}
	return nil
}

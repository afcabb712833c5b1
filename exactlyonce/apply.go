package exactlyonce

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/internal/pgarray"
	"github.com/idemd/idemd/outbox"
	"github.com/idemd/idemd/processed"
)

// queue collects the statements and events of one try of a batch whose results nobody
// needs, so that they reach PostgreSQL in one round trip (send). A statement whose result
// is needed (a guard, rows an answer is built from, a Go effect that reads) sends what is
// queued first, so statements still run in the batch's order. A direct queue holds nothing
// back: everything runs at once (savepoints, replays).
type queue struct {
	direct bool
	batch  pgx.Batch
	events []outbox.Event
	// many is the run of consecutive effects with the same Effect.Many, not yet in batch.
	many manyRun
	// size is how many messages the try has (the capacity of a run's columns).
	size int
	// wake are the outbox listeners to wake once the transaction committed (the NOTIFY is
	// not sent inside it: see outbox.Store.QueueQuiet).
	wake outbox.Wake
	// handed are the outbox rows to hand to the relay of this process once the transaction
	// committed (Config.Handoff); the relay is woken by the handing, not in wake.
	handed []*outbox.Handed
	// spans of the queued statements, ended when they are sent (trace.go)
	spans []trace.Span
}

// manyRun collects the effects of consecutive messages that share one multi-message
// statement (Effect.Many): column k holds the k-th argument of each.
type manyRun struct {
	effect *Effect // the first one
	n      int
	cols   [][]any
}

// queueEffect queues e: into the run of e.Many when it has one, else as its own statement.
func (q *queue) queueEffect(e *Effect) {
	if e.Many == "" {
		q.flushMany()
		q.batch.Queue(e.SQL, e.Args...)
		return
	}
	r := &q.many
	if r.effect != nil && (r.effect.Many != e.Many || len(e.Args) != len(r.cols)) {
		q.flushMany()
	}
	if r.effect == nil {
		r.effect, r.n = e, 0
		r.cols = make([][]any, len(e.Args))
		for k := range r.cols {
			r.cols[k] = make([]any, 0, max(q.size, 2))
		}
	}
	for k, a := range e.Args {
		r.cols[k] = append(r.cols[k], a)
	}
	r.n++
}

// flushMany queues the run of multi-message effects as one statement (a run of one as
// the message's own statement), so that what is queued next runs after it.
func (q *queue) flushMany() {
	r := &q.many
	switch {
	case r.effect == nil:
		return
	case r.n == 1:
		q.batch.Queue(r.effect.SQL, r.effect.Args...)
	default:
		args := make([]any, len(r.cols))
		for k := range r.cols {
			args[k] = r.cols[k]
		}
		q.batch.Queue(r.effect.Many, args...)
	}
	r.effect, r.n, r.cols = nil, 0, nil
}

// send runs what q holds in tx and empties it.
func (u *Unit) send(ctx context.Context, tx pgx.Tx, q *queue) error {
	if err := u.complete(q); err != nil {
		return err
	}
	if q.batch.Len() == 0 {
		return nil
	}
	pgarray.Reserve(tx.Conn(), &q.batch)
	err := tx.SendBatch(ctx, &q.batch).Close()
	q.batch = pgx.Batch{}
	q.endSpans(err)
	if err != nil {
		return fmt.Errorf("error running the batch's effects: %w", err)
	}
	return nil
}

// complete puts what q still holds apart into its batch: the run of multi-message effects
// and the outbox rows of its events. An event the outbox refuses is a Permanent error.
func (u *Unit) complete(q *queue) error {
	q.flushMany()
	if len(q.events) > 0 {
		w, h, err := u.outbox.QueueHanded(&q.batch, q.events...)
		if err != nil {
			return Permanent(err)
		}
		q.wake |= w
		if h != nil {
			q.handed = append(q.handed, h)
		}
		q.events = nil
	}
	return nil
}

// run applies one claimed message on the fast path: its statements are queued on q. A
// permanent failure abandons the try (errCareful), to be run again with savepoints.
func (u *Unit) run(ctx context.Context, tx pgx.Tx, m *Message, q *queue) error {
	if m.Invalid != nil {
		m.Outcome, m.Cause = DeadLettered, m.Invalid
		return u.deadLetter(ctx, tx, m, q)
	}
	m.Attempts = 1
	if err := u.apply(ctx, tx, m, q); err != nil {
		if IsPermanent(err) {
			return errCareful
		}
		return err
	}
	return nil
}

// runCareful applies one claimed message with a savepoint around each attempt, so that a
// permanent failure rolls back only this message's work; after MaxAttempts failures the
// message is dead-lettered. q is direct.
func (u *Unit) runCareful(ctx context.Context, tx pgx.Tx, m *Message, q *queue) error {
	var cause error
	if m.Invalid != nil {
		cause = m.Invalid
	} else {
		for m.Attempts < max(m.MaxAttempts, 1) {
			m.Attempts++
			err := savepoint(ctx, tx, func(sp pgx.Tx) error { return u.apply(ctx, sp, m, q) })
			if err == nil {
				return nil
			}
			if !IsPermanent(err) {
				return err
			}
			cause = err
		}
	}
	m.Outcome, m.Cause, m.Response = DeadLettered, cause, nil
	if err := savepoint(ctx, tx, func(sp pgx.Tx) error { return u.deadLetter(ctx, sp, m, q) }); err != nil {
		// A dead letter that cannot be written is not the message's fault: retry all.
		return fmt.Errorf("error dead-lettering message %q: %w", m.ID, err)
	}
	return nil
}

// apply runs m's guard, effect and events in tx and builds its answer. What can wait is
// queued on q, unless q is direct.
func (u *Unit) apply(ctx context.Context, tx pgx.Tx, m *Message, q *queue) error {
	if m.Guard != nil {
		if err := u.sendIf(ctx, tx, q); err != nil {
			return err
		}
		fresh, err := u.guard(ctx, tx, m.Guard, m.ID)
		if err != nil {
			return err
		}
		if !fresh {
			m.Outcome = Stale
			return u.markStale(ctx, tx, m, q)
		}
	}
	span := u.startEffect(ctx, m)
	res, err := u.effect(ctx, tx, m, q)
	finish(q, span, err)
	if err != nil {
		return err
	}
	if m.Answer != nil {
		m.Response = m.answer(res)
	}
	// A business answer (not 2xx) is the request's answer, not its success: what the
	// effect wrote commits, but nothing is published.
	if len(m.Events) > 0 && (res.reply == nil || res.reply.Status/100 == 2) {
		events := q.room(len(m.Events))
		for i, e := range m.Events {
			events[i] = e.Event
			if e.FromResult {
				events[i].Payload = res.body
				if res.body == nil {
					events[i].Payload = []byte("null")
				}
			}
		}
		span, events := u.startEnqueue(ctx, m, events)
		err := u.enqueue(ctx, tx, q, events)
		finish(q, span, err)
		if err != nil {
			return err
		}
	}
	m.Outcome = Applied
	return nil
}

// markStale marks m's record as skipped by its guard (processed.Record.Stale): the record
// is done, as an applied message's, and only this tells them apart. Unless q is direct the
// statement is queued: it costs a stale message no round trip of its own, and an applied
// one nothing.
func (u *Unit) markStale(ctx context.Context, tx pgx.Tx, m *Message, q *queue) error {
	st := processed.Stale{Entity: m.Guard.Entity, Version: m.Guard.Version}
	if !q.direct {
		q.flushMany()
		u.cfg.Processed.QueueStale(&q.batch, m.Scope, m.ID, st)
		return nil
	}
	return u.cfg.Processed.MarkStaleTx(ctx, tx, m.Scope, m.ID, st)
}

// sendIf sends what a queue that is not direct holds.
func (u *Unit) sendIf(ctx context.Context, tx pgx.Tx, q *queue) error {
	if q.direct {
		return nil
	}
	return u.send(ctx, tx, q)
}

// room returns room for n events of a message, which enqueue then writes or queues. On a
// queue that is not direct the room is at the end of q.events, so that the events are
// queued as they are made, with no copy; a try's first events make room for as many for
// each of its messages: one allocation rather than a slice doubling through the batch.
func (q *queue) room(n int) []outbox.Event {
	if q.direct {
		return make([]outbox.Event, n)
	}
	if q.events == nil && q.size > 1 {
		q.events = make([]outbox.Event, 0, q.size*n)
	}
	k := len(q.events)
	q.events = slices.Grow(q.events, n)[:k+n]
	return q.events[k:]
}

// enqueue writes events, made in q.room, to the outbox; on a queue that is not direct
// they are queued already.
func (u *Unit) enqueue(ctx context.Context, tx pgx.Tx, q *queue, events []outbox.Event) error {
	if !q.direct {
		return nil
	}
	var b pgx.Batch
	w, err := u.outbox.QueueQuiet(&b, events...)
	if err != nil {
		return Permanent(err)
	}
	pgarray.Reserve(tx.Conn(), &b)
	if err := tx.SendBatch(ctx, &b).Close(); err != nil {
		return fmt.Errorf("error enqueueing outbox events: %w", err)
	}
	q.wake |= w
	return nil
}

// needsResult: the effect's result is read (an answer, or an event that publishes it), so
// its SQL must run now rather than be queued.
func (m *Message) needsResult() bool {
	if m.Answer != nil {
		return true
	}
	for _, e := range m.Events {
		if e.FromResult {
			return true
		}
	}
	return false
}

// effect runs m's effect and returns its result.
func (u *Unit) effect(ctx context.Context, tx pgx.Tx, m *Message, q *queue) (*result, error) {
	e := &m.Effect
	res := &result{affected: -1}
	if e.SQL != "" {
		switch {
		case !m.needsResult() && !q.direct:
			q.queueEffect(e)
		case !m.needsResult():
			if _, err := tx.Exec(ctx, e.SQL, e.Args...); err != nil {
				return nil, fmt.Errorf("error running the SQL effect: %w", err)
			}
		default:
			if err := u.sendIf(ctx, tx, q); err != nil {
				return nil, err
			}
			rows, err := tx.Query(ctx, e.SQL, e.Args...)
			if err != nil {
				return nil, fmt.Errorf("error running the SQL effect: %w", err)
			}
			maps, affected, err := collect(rows)
			if err != nil {
				return nil, fmt.Errorf("error running the SQL effect: %w", err)
			}
			if res, err = rowsResult(maps, affected, m.Answer != nil); err != nil {
				return nil, err
			}
			if res.reply != nil {
				return res, nil // the answer is given: the Go effect does not run
			}
		}
	}
	if e.Func != nil {
		if err := u.sendIf(ctx, tx, q); err != nil {
			return nil, err
		}
		v, err := e.Func(ctx, tx)
		if be, ok := asBusinessError(err); ok {
			if m.Answer == nil {
				return nil, Permanent(err) // no answer to give: the message cannot be applied
			}
			if res.reply, err = businessReply(be); err != nil {
				return nil, err
			}
			res.body = res.reply.Body
			return res, nil
		}
		if err != nil {
			return nil, err
		}
		if res.body, err = resultJSON(v); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// deadLetter writes m's letter and letter events for m.Cause, and builds its failure
// answer. Unless q is direct they are queued.
func (u *Unit) deadLetter(ctx context.Context, tx pgx.Tx, m *Message, q *queue) error {
	reason := m.Cause.Error()
	if m.Letterer != nil {
		m.Letter, m.LetterEvents = m.Letterer.DeadLetter(m)
		m.Letterer = nil
	}
	if m.Letter != nil {
		l := *m.Letter
		l.Reason, l.Attempts = reason, m.Attempts
		if !q.direct {
			q.flushMany()
			if err := u.letters.Queue(&q.batch, &l); err != nil {
				return err
			}
		} else if _, err := u.letters.WriteTx(ctx, tx, &l); err != nil {
			return err
		}
	}
	if len(m.LetterEvents) > 0 {
		events := q.room(len(m.LetterEvents))
		for i, e := range m.LetterEvents {
			e.Headers = maps.Clone(e.Headers)
			if e.Headers == nil {
				e.Headers = map[string]string{}
			}
			e.Headers[deadletter.HeaderReason] = reason
			events[i] = e
		}
		span, events := u.startEnqueue(ctx, m, events)
		err := u.enqueue(ctx, tx, q, events)
		finish(q, span, err)
		if err != nil {
			return err
		}
	}
	if m.Answer != nil && m.Answer.Failed != nil {
		m.Response = m.Answer.Failed(m.Cause)
	}
	return nil
}

// guard records g's version for its entity when it is newer than the last applied one and
// reports whether it was. The row lock it takes serializes messages of one entity across
// partitions, doors and processes.
func (u *Unit) guard(ctx context.Context, tx pgx.Tx, g *Guard, id string) (bool, error) {
	rows, err := tx.Query(ctx, u.guardSQL, g.Scope, g.Entity, g.Version, id)
	if err != nil {
		return false, fmt.Errorf("error checking the entity version: %w", err)
	}
	n := 0
	for rows.Next() {
		n++
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return false, fmt.Errorf("error checking the entity version: %w", err)
	}
	return n == 1, nil
}

func guardSQL(schema string) string {
	t := pgx.Identifier{schema, "entity_versions"}.Sanitize()
	return `INSERT INTO ` + t + ` AS v (scope, entity, version, message_id) VALUES ($1, $2, $3::numeric, $4)
ON CONFLICT (scope, entity) DO UPDATE
    SET version = excluded.version, message_id = excluded.message_id, updated_at = now()
    WHERE v.version < excluded.version
RETURNING 1`
}

func savepoint(ctx context.Context, tx pgx.Tx, fn func(pgx.Tx) error) error {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return fmt.Errorf("error creating savepoint: %w", err)
	}
	if err := fn(sp); err != nil {
		if rbErr := sp.Rollback(ctx); rbErr != nil {
			return errors.Join(err, fmt.Errorf("error rolling back to savepoint: %w", rbErr))
		}
		return err
	}
	if err := sp.Commit(ctx); err != nil {
		return fmt.Errorf("error releasing savepoint: %w", err)
	}
	return nil
}

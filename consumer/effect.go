package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/exactlyonce"
	"github.com/idemd/idemd/internal/effectsql"
	"github.com/idemd/idemd/outbox"
	"github.com/idemd/idemd/processed"
)

// Handler is a Go effect for what SQL cannot express. It runs inside the transaction that
// claims msg.ID, so everything it writes through tx commits together with the claim or not
// at all. It must not commit or roll back tx. An error marked with Permanent dead-letters
// the message after MaxAttempts; any other error is retried with backoff, for ever.
type Handler func(ctx context.Context, tx pgx.Tx, msg Message) error

// Permanent marks err as permanent: the message will fail the same way on every retry, so
// it is tried DeadLetter.MaxAttempts times and then dead-lettered, instead of blocking its
// partition. Database errors of classes 22, 23 and 42 are permanent without it.
func Permanent(err error) error { return exactlyonce.Permanent(err) }

// ErrNoMessageID is the reason a record without a message id is dead-lettered.
var ErrNoMessageID = errors.New("no message id")

// Params are the named parameters a SQL effect may use (pgx named arguments, @name).
var Params = effectsql.Params

// pending holds the statements and outbox events the effects of one try queued, sent in one
// round trip by flush (exactlyonce.Config.Flush) or before a statement whose result is needed.
type pending struct {
	tx     pgx.Tx
	batch  pgx.Batch
	events []outbox.Event
}

func (p *pending) reset(tx pgx.Tx) {
	p.tx, p.batch, p.events = tx, pgx.Batch{}, nil
}

// send sends what is queued, in tx.
func (c *Consumer) send(ctx context.Context, tx pgx.Tx, p *pending) error {
	if len(p.events) > 0 {
		if err := c.outbox.Queue(&p.batch, p.events...); err != nil {
			return err
		}
		p.events = nil
	}
	if p.batch.Len() == 0 {
		return nil
	}
	err := tx.SendBatch(ctx, &p.batch).Close()
	p.batch = pgx.Batch{}
	if err != nil {
		return fmt.Errorf("error running queued effects: %w", err)
	}
	return nil
}

// flush is the unit's Flush hook: it sends the effects the current try queued.
func (c *Consumer) flush(ctx context.Context, tx pgx.Tx, msgs []*exactlyonce.Message) error {
	p := msgs[0].Value.(*record).pending
	if p.tx != tx {
		// Nothing was queued in this try; what is there belongs to a rolled-back one.
		p.reset(tx)
		return nil
	}
	return c.send(ctx, tx, p)
}

// effect is the exactlyonce effect of a record with an id. On the fast path it queues its
// statements; after a permanent failure in the batch (m.Careful) it runs them at once, in
// the savepoint Apply gives it.
func (c *Consumer) effect(ctx context.Context, tx pgx.Tx, m *exactlyonce.Message) (*processed.Response, error) {
	r := m.Value.(*record)
	var q *pending
	if !m.Careful {
		q = r.pending
		if q.tx != tx {
			q.reset(tx)
		}
	}
	return nil, c.apply(ctx, tx, r, q)
}

// apply runs r's effect in tx: the stale guard, the SQL effect, the handler, the publish
// event. With q set, statements whose result is not needed are queued on it.
func (c *Consumer) apply(ctx context.Context, tx pgx.Tx, r *record, q *pending) error {
	r.stale = false
	if c.cfg.Order != nil {
		if q != nil {
			if err := c.send(ctx, tx, q); err != nil {
				return err
			}
		}
		fresh, err := c.guard(ctx, tx, r)
		if err != nil {
			return err
		}
		if !fresh {
			r.stale = true
			return nil
		}
	}
	if c.cfg.SQL != "" {
		args := c.args(r)
		if q != nil {
			q.batch.Queue(c.sql, args...)
		} else if _, err := tx.Exec(ctx, c.sql, args...); err != nil {
			return fmt.Errorf("error running the SQL effect: %w", err)
		}
	}
	if c.cfg.Handler != nil {
		if q != nil {
			if err := c.send(ctx, tx, q); err != nil {
				return err
			}
		}
		if err := c.cfg.Handler(ctx, tx, r.msg); err != nil {
			return err
		}
	}
	if c.cfg.Publish != nil {
		ev := c.publishEvent(r)
		if q != nil {
			q.events = append(q.events, ev)
		} else if err := c.outbox.EnqueueTx(ctx, tx, ev); err != nil {
			return err
		}
	}
	return nil
}

// guard is the stale-event guard: it records r's version for its entity when it is newer
// than the last applied one and reports whether it was. The row lock it takes serializes
// messages of one entity across partitions and consumers.
func (c *Consumer) guard(ctx context.Context, tx pgx.Tx, r *record) (bool, error) {
	entity, ok := r.lookup(&c.cfg.Order.Entity)
	if !ok {
		return false, Permanent(fmt.Errorf("order: entity (%s) is missing", c.cfg.Order.Entity.String()))
	}
	raw, ok := r.lookup(&c.cfg.Order.Version)
	if !ok {
		return false, Permanent(fmt.Errorf("order: version (%s) is missing", c.cfg.Order.Version.String()))
	}
	version, err := parseVersion(raw)
	if err != nil {
		return false, Permanent(fmt.Errorf("order: %w", err))
	}
	rows, err := tx.Query(ctx, c.guardSQL, c.cfg.Name, entity, version, r.msg.ID)
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

// args are the SQL effect's named arguments (SPEC 2.3). Kafka records have no tenant:
// @tenant is NULL.
// args are the values of the SQL effect's parameters, in the order of its positional form
// (rewritten once, at New): only the parameters the SQL uses are computed.
func (c *Consumer) args(r *record) []any {
	args := make([]any, len(c.sqlParams))
	for i, p := range c.sqlParams {
		switch p {
		case "message_id":
			args[i] = r.msg.ID
		case "payload":
			args[i] = string(r.msg.Value)
		case "headers":
			headers, _ := json.Marshal(r.msg.Headers)
			args[i] = string(headers)
		case "source":
			args[i] = c.cfg.Name
		case "tenant":
			args[i] = nil
		case "key":
			if r.msg.Key != nil {
				args[i] = string(r.msg.Key)
			}
		case "topic":
			args[i] = r.msg.Topic
		case "partition":
			args[i] = r.msg.Partition
		case "offset":
			args[i] = r.msg.Offset
		case "received_at":
			args[i] = r.msg.ReceivedAt
		}
	}
	return args
}

func (c *Consumer) publishEvent(r *record) outbox.Event {
	ev := outbox.Event{
		Topic:       c.cfg.Publish.Topic,
		Endpoint:    c.cfg.Publish.Endpoint,
		Payload:     r.msg.Value,
		Pipeline:    c.cfg.Name,
		CausationID: r.msg.ID,
		// Set explicitly: the fast path enqueues the events of a whole batch in one call.
		OperationID: outbox.OperationID(c.cfg.Name, r.msg.ID, 0),
		Headers:     passHeaders(r),
	}
	if c.cfg.Publish.Key != nil {
		if k, ok := r.lookup(c.cfg.Publish.Key); ok {
			ev.Key = []byte(k)
		}
	}
	return ev
}

// passHeaders are the inbound headers an outbound record keeps.
func passHeaders(r *record) map[string]string {
	h := map[string]string{}
	for _, name := range []string{outbox.HeaderContentType, outbox.HeaderEventType} {
		if v, ok := r.msg.Headers[name]; ok {
			h[name] = v
		}
	}
	if _, ok := h[outbox.HeaderContentType]; !ok {
		// json.Valid rather than r.json(): knowing that the value is JSON does not need
		// the decoded document, which costs an allocation per node. Invalid UTF-8 is not
		// JSON, as in r.json().
		isJSON := r.isJSON
		if !r.parsed {
			isJSON = json.Valid(r.msg.Value) && utf8.Valid(r.msg.Value)
		}
		if isJSON {
			h[outbox.HeaderContentType] = "application/json"
		}
	}
	return h
}

// noID is the effect of a record without a message id: it fails permanently, once, so that
// the record is dead-lettered with that reason.
func noID(context.Context, pgx.Tx, *exactlyonce.Message) (*processed.Response, error) {
	return nil, Permanent(ErrNoMessageID)
}

// ErrMalformedMessageID is the reason a record whose message id is not 1-255 bytes of UTF-8
// text without control characters is dead-lettered.
var ErrMalformedMessageID = errors.New("malformed message id: want 1-255 bytes of UTF-8 text without control characters")

// malformedID is noID for an id that cannot be claimed (processed.ValidID).
func malformedID(context.Context, pgx.Tx, *exactlyonce.Message) (*processed.Response, error) {
	return nil, Permanent(ErrMalformedMessageID)
}

// Dead-letter record headers, beside content-type and event-type.
const (
	HeaderDeadLetterReason = "idemd-dead-letter-reason"
	HeaderSourceTopic      = "idemd-source-topic"
	HeaderSourcePartition  = "idemd-source-partition"
	HeaderSourceOffset     = "idemd-source-offset"
	HeaderMessageID        = "message-id"
)

// deadLetter writes the dead_letters row and, when configured, the dead-letter topic record,
// in the transaction that marks the message processed (state dead).
func (c *Consumer) deadLetter(ctx context.Context, tx pgx.Tx, m *exactlyonce.Message, cause error) (*processed.Response, error) {
	r := m.Value.(*record)
	headers := make(map[string][]string, len(r.raw.Headers))
	for _, h := range r.raw.Headers {
		headers[h.Key] = append(headers[h.Key], string(h.Value))
	}
	meta := map[string]any{
		"topic": r.msg.Topic, "partition": r.msg.Partition, "offset": r.msg.Offset,
		"timestamp": r.msg.Time.UTC().Format(time.RFC3339Nano),
	}
	if r.msg.Key != nil {
		meta["key"] = string(r.msg.Key)
	}
	if r.msg.ID == "" {
		meta["dedup_id"] = m.ID
	}
	if _, err := c.dead.WriteTx(ctx, tx, &deadletter.Letter{
		Pipeline: c.cfg.Name, Scope: c.cfg.Name, MessageID: r.msg.ID, Payload: r.msg.Value,
		Headers: headers, Metadata: meta, Reason: cause.Error(), Attempts: m.Attempts,
	}); err != nil {
		return nil, err
	}
	if c.cfg.DeadLetter.Topic == "" {
		return nil, nil
	}
	h := passHeaders(r)
	h[HeaderDeadLetterReason] = cause.Error()
	h[HeaderSourceTopic] = r.msg.Topic
	h[HeaderSourcePartition] = strconv.Itoa(r.msg.Partition)
	h[HeaderSourceOffset] = strconv.FormatInt(r.msg.Offset, 10)
	if r.msg.ID != "" {
		h[HeaderMessageID] = r.msg.ID
	}
	ev := outbox.Event{
		Topic: c.cfg.DeadLetter.Topic, Key: r.msg.Key, Payload: r.msg.Value, Headers: h,
		Pipeline: c.cfg.Name, CausationID: m.ID,
		// Distinct from the id of the message's own publish event.
		OperationID: outbox.OperationID(c.cfg.Name+"/dead-letter", m.ID, 0),
	}
	return nil, c.outbox.EnqueueTx(ctx, tx, ev)
}

// checkSQL makes sure sql uses known parameters only and prepares (internal/effectsql). It
// returns sql's positional form and the names of its parameters in order, so that messages
// need no rewriting.
func checkSQL(ctx context.Context, pool *pgxpool.Pool, sql string) (string, []string, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return "", nil, fmt.Errorf("error connecting to check the SQL: %w", err)
	}
	defer conn.Release()
	positional, names, err := effectsql.Compile(ctx, conn.Conn(), sql)
	if err != nil && !errors.Is(err, effectsql.ErrUnknownParameter) {
		err = fmt.Errorf("does not prepare: %w", err)
	}
	return positional, names, err
}

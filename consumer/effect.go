package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/exactlyonce"
	"github.com/idemd/idemd/internal/effectsql"
	"github.com/idemd/idemd/internal/fingerprint"
	"github.com/idemd/idemd/outbox"
	"github.com/idemd/idemd/pipeline"
	"github.com/idemd/idemd/processed"
)

// Handler is a Go effect for what SQL cannot express. It runs inside the transaction that
// claims msg.ID, so everything it writes through tx commits together with the claim or not
// at all. It must not commit or roll back tx. An error marked with exactlyonce.Permanent
// dead-letters the message after DeadLetter.MaxAttempts such failures; any other error is
// retried with backoff, for ever.
//
// A Handler may run more often than that for one message, with the same msg: when any
// message of its batch fails transiently (its own Handler, a serialization failure, a lost
// connection), the whole batch's transaction rolls back and every Handler of the batch
// runs again. The rolled-back runs leave nothing in the database, so the effect through tx
// is applied once; an effect outside tx (an HTTP call, a message to another system) must
// be idempotent itself, for example keyed by msg.ID.
type Handler func(ctx context.Context, tx pgx.Tx, msg Message) error

// ErrNoMessageID is the reason a record without a message id is dead-lettered.
var ErrNoMessageID = errors.New("no message id")

// ErrMalformedMessageID is the reason a record whose message id is not 1-255 bytes of UTF-8
// text without control characters (read from JSON: a string, or a number as written; not a
// boolean) is dead-lettered.
var ErrMalformedMessageID = errors.New("malformed message id: want 1-255 bytes of UTF-8 text without control characters (from JSON, a string or a number)")

// Params are the named parameters a SQL effect may use (pgx named arguments, @name).
var Params = effectsql.Params

// message is the unit-of-work message of a record, built in u (zero): its key,
// fingerprint, bound effect, event, stale guard, and the dead letter it becomes if it fails.
func (c *Consumer) message(u *unitMessage, r *record) *exactlyonce.Message {
	id, ok := r.id(c.cfg.MessageID)
	return c.messageWithID(u, r, id, ok)
}

// unitMessage is a record's unit message, and the Letterer that makes its dead letter
// only if it is dead-lettered: almost no message is, and the letter's parts were a sixth of
// the bytes the door allocated per record (BENCHMARKS.md, phase 13).
type unitMessage struct {
	m exactlyonce.Message
	c *Consumer
	r *record
	// args back the effect's arguments for statements of up to len(args) parameters,
	// events the events of up to len(events) publish targets.
	args   [6]any
	events [1]exactlyonce.Event
}

// unitSlabs keep a batch's unit messages for the next batch: allocated for each record,
// they were a seventh of the bytes the consumer's process allocated (BENCHMARKS.md, phase
// 37). A batch is done with them once process returns: the unit, the batch's spans and the
// counting of its outcomes have read them, and nothing the effects, events, dead letters or
// AfterCommit keep points into them (AfterCommit gets copies of the records' Messages).
// They are put back cleared, so that they pin no record, and not when a batch was larger
// than unitSlabMax.
var unitSlabs = sync.Pool{New: func() any { return new([]unitMessage) }}

const unitSlabMax = 4 * BatchSizeDefault

// unitSlab is n zero unit messages, and the function that puts them back.
func unitSlab(n int) ([]unitMessage, func()) {
	slab := unitSlabs.Get().(*[]unitMessage)
	us := slices.Grow((*slab)[:0], n)[:n]
	return us, func() {
		if cap(us) > unitSlabMax {
			return
		}
		clear(us)
		*slab = us[:0]
		unitSlabs.Put(slab)
	}
}

// letterParts are a dead letter and the record it came from, in one allocation.
type letterParts struct {
	letter deadletter.Letter
	source deadletter.Record
	// headers back source.Headers for records of up to len(headers) headers.
	headers [4]deadletter.Header
}

// DeadLetter is the record's letter, and its dead-letter topic record when the pipeline
// has one.
func (u *unitMessage) DeadLetter(m *exactlyonce.Message) (*deadletter.Letter, []outbox.Event) {
	l := u.c.letter(u.r, m.ID)
	if u.c.cfg.DeadLetter.Topic == "" {
		return l, nil
	}
	return l, []outbox.Event{u.c.letterEvent(u.r, m.ID)}
}

// messageWithID is message for the id found (ok) in the record.
func (c *Consumer) messageWithID(u *unitMessage, r *record, id string, ok bool) *exactlyonce.Message {
	fp, isJSON := fingerprint.BodyJSON(r.msg.Value)
	r.validJSON, r.validKnown = isJSON, true
	u.c, u.r = c, r
	m := &u.m
	*m = exactlyonce.Message{
		Scope:       c.cfg.Name,
		Fingerprint: fp,
		Payload:     r.msg.Value,
		Retention:   c.cfg.Retention,
		MaxAttempts: c.cfg.DeadLetter.MaxAttempts,
	}
	switch {
	case ok && processed.ValidID(id):
		r.msg.ID, m.ID = id, id
	case ok: // too long, not UTF-8, control characters: not storable as an id
		m.Invalid = ErrMalformedMessageID
	default:
		m.Invalid = ErrNoMessageID
	}
	if m.Invalid != nil {
		// Deduplicated by position (Kafka) or by the broker's message id (Pub/Sub, SQS),
		// so that a redelivery is not dead-lettered twice. A position holds another record
		// once its topic is deleted and created again (offsets start from 0 again): the
		// record's timestamp, the same on every redelivery, tells the two apart.
		if r.msg.Door == DoorKafka {
			m.ID = "kafka-position:" + r.msg.Topic + "/" + strconv.Itoa(r.msg.Partition) + "/" + strconv.FormatInt(r.msg.Offset, 10) +
				"@" + strconv.FormatInt(r.msg.Time.UnixMilli(), 10)
		} else {
			m.ID = r.msg.Door + "-message:" + r.msg.BrokerID
		}
	} else {
		c.bind(u, r)
	}
	m.Letterer = u
	return m
}

// bind gives u's message the record's stale guard, effect and events.
func (c *Consumer) bind(u *unitMessage, r *record) {
	m := &u.m
	if c.cfg.Order != nil {
		g, err := c.guard(r)
		if err != nil {
			m.Invalid = err
			return
		}
		m.Guard = g
	}
	if c.stmt != nil {
		m.Effect.SQL, m.Effect.Many = c.stmt.SQL, c.stmt.Many
		v := &effectsql.Values{
			MessageID: r.msg.ID, Payload: r.msg.Value, Source: c.cfg.Name, Key: r.msg.Key,
			ReceivedAt: r.msg.ReceivedAt,
		}
		if c.stmtHeaders {
			v.Headers = r.headers()
		}
		if r.msg.Door == DoorKafka { // Pub/Sub and SQS have no position: NULL
			v.Position = effectsql.Position{Topic: r.msg.Topic, Partition: r.msg.Partition, Offset: r.msg.Offset}
		}
		m.Effect.Args = c.stmt.AppendArgs(u.args[:0], v)
	}
	if h := c.cfg.Handler; h != nil {
		r.headers()
		msg := r.msg
		m.Effect.Func = func(ctx context.Context, tx pgx.Tx) (any, error) { return nil, h(ctx, tx, msg) }
	}
	if len(c.cfg.Publish) == 0 {
		return
	}
	// Each target's event has its own operation id (pipeline.Targets), set explicitly: the
	// events of a whole batch are enqueued in one call.
	var buf [2]pipeline.Routed // most pipelines publish to one or two targets
	routed := c.cfg.Publish.AppendRoute(buf[:0], c.cfg.Name, c.cfg.Name, r.msg.ID, outbox.Event{Payload: r.msg.Value, Headers: passHeaders(r)}, r)
	m.Events = u.events[:0]
	for _, e := range routed {
		m.Events = append(m.Events, exactlyonce.Event{Event: e.Event})
	}
}

// guard reads the record's entity and version for the stale-event guard.
func (c *Consumer) guard(r *record) (*exactlyonce.Guard, error) {
	entity, version, err := c.cfg.Order.Read(r.Field)
	if err != nil {
		return nil, err
	}
	return &exactlyonce.Guard{Scope: c.cfg.Name, Entity: entity, Version: version}, nil
}

// passHeaders are the inbound headers an outbound record keeps. Most records keep only a
// JSON content type: they share jsonOnly, which nothing writes to (routing clones it for a
// second target, tracing copies it), instead of a map each.
func passHeaders(r *record) map[string]string {
	ct, hasCT := r.header(outbox.HeaderContentType)
	et, hasET := r.header(outbox.HeaderEventType)
	if !hasCT {
		// json.Valid rather than r.json(): knowing that the value is JSON does not need
		// the decoded document, which costs an allocation per node. Invalid UTF-8 is not
		// JSON, as in r.json(). The fingerprint has usually given the verdict already.
		isJSON := r.isJSON
		switch {
		case r.parsed:
		case r.validKnown:
			isJSON = r.validJSON
		default:
			isJSON = json.Valid(r.msg.Value) && utf8.Valid(r.msg.Value)
		}
		// Every outbound record says what it carries (SPEC 2.6): bytes that are not JSON,
		// sent without a content type, are application/octet-stream, as the receiver
		// labels such a body.
		ct, hasCT = contentTypeOctets, true
		if isJSON {
			ct = contentTypeJSON
		}
	}
	if !hasET && hasCT && ct == contentTypeJSON {
		return jsonOnly
	}
	h := make(map[string]string, 2)
	if hasCT {
		h[outbox.HeaderContentType] = ct
	}
	if hasET {
		h[outbox.HeaderEventType] = et
	}
	return h
}

const (
	contentTypeJSON   = "application/json"
	contentTypeOctets = "application/octet-stream"
)

// jsonOnly is the headers of most outbound records (passHeaders); read only.
var jsonOnly = map[string]string{outbox.HeaderContentType: contentTypeJSON}

// Dead-letter record headers, beside content-type, event-type and
// deadletter.HeaderReason. A Pub/Sub or SQS message's letter record has the subscription or
// queue as its source topic, and the broker's message id instead of a partition and offset.
const (
	HeaderSourceTopic     = "idemd-source-topic"
	HeaderSourcePartition = "idemd-source-partition"
	HeaderSourceOffset    = "idemd-source-offset"
	HeaderSourceMessageID = "idemd-source-message-id"
	HeaderMessageID       = "message-id"
)

// letter is the dead_letters row of the record, dedupID its key in processed_messages. Where
// the record was read, its key, time and headers go as typed data (deadletter.Record), made
// into the letter's metadata and headers only if it is written: the maps took a dozen
// allocations per record, for letters that are almost never written (BENCHMARKS.md, phase 3).
func (c *Consumer) letter(r *record, dedupID string) *deadletter.Letter {
	p := &letterParts{}
	src := &p.source
	*src = deadletter.Record{Key: r.msg.Key, Time: r.msg.Time}
	if r.msg.Door == DoorKafka {
		src.Topic, src.Partition, src.Offset = r.msg.Topic, r.msg.Partition, r.msg.Offset
		if n := len(r.rawHeaders); n > 0 {
			src.Headers = p.headers[:0]
			if n > len(p.headers) {
				src.Headers = make([]deadletter.Header, 0, n)
			}
			for _, h := range r.rawHeaders {
				src.Headers = append(src.Headers, deadletter.Header(h))
			}
		}
	} else {
		src.Subscription, src.BrokerMessageID = r.msg.Topic, r.msg.BrokerID
		src.Ordered = r.broker != nil && r.broker.Ordered
		src.DeliveryAttempt = r.msg.DeliveryAttempt
		src.Attributes = r.msg.Headers
	}
	if r.msg.ID == "" {
		src.DedupID = dedupID
	}
	p.letter = deadletter.Letter{
		Pipeline: c.cfg.Name, Origin: deadletter.Origin{Door: deadletter.Door(r.msg.Door)}, Scope: c.cfg.Name,
		MessageID: r.msg.ID, Payload: r.msg.Value, Record: src,
	}
	return &p.letter
}

// letterEvent is the record of the dead-letter topic, written through the outbox with the
// letter; the unit adds the reason header.
func (c *Consumer) letterEvent(r *record, dedupID string) outbox.Event {
	h := maps.Clone(passHeaders(r)) // it may be jsonOnly, which other records' events share
	h[HeaderSourceTopic] = r.msg.Topic
	if r.msg.Door == DoorKafka {
		h[HeaderSourcePartition] = strconv.Itoa(r.msg.Partition)
		h[HeaderSourceOffset] = strconv.FormatInt(r.msg.Offset, 10)
	} else {
		h[HeaderSourceMessageID] = r.msg.BrokerID
	}
	if r.msg.ID != "" {
		h[HeaderMessageID] = r.msg.ID
	}
	return outbox.Event{
		Topic: c.cfg.DeadLetter.Topic, Key: r.msg.Key, Payload: r.msg.Value, Headers: h,
		Pipeline: c.cfg.Name, CausationID: dedupID,
		// Distinct from the id of the message's own publish event.
		OperationID: outbox.OperationID(c.cfg.Name+"/dead-letter", dedupID, 0),
	}
}

// checkSQL makes sure sql uses known parameters only and prepares (internal/effectsql).
func checkSQL(ctx context.Context, pool *pgxpool.Pool, sql string) (*effectsql.Statement, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("error connecting to check the SQL: %w", err)
	}
	defer conn.Release()
	stmt, err := effectsql.Prepare(ctx, conn.Conn(), sql)
	if err != nil && !errors.Is(err, effectsql.ErrUnknownParameter) {
		err = fmt.Errorf("does not prepare: %w", err)
	}
	return stmt, err
}

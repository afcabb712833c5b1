// Package outbox writes events to be published to Kafka, Google Cloud Pub/Sub or Amazon SQS
// in the caller's transaction, and relays them. Guarantee: an outbox row commits if and
// only if the caller's transaction commits; every committed row is then published at least
// once, with an operation id that is the same on every attempt (a header, an attribute, and
// on an SQS FIFO queue the MessageDeduplicationId), so that a consumer deduping on it
// applies it exactly once — unless its broker refuses it for good (too large, invalid, or
// its topic or queue kept refusing every publish for RelayConfig.MaxFailingFor): then it is
// moved to dead_letters, from where a replay publishes it to the same destination with the
// same operation id. Events of one key are published in order. One failing destination
// never holds back the others. An event's destination is encoded in Event.Topic
// (ParseDestination): a Kafka topic, PubSubDestination(topic) or SQSDestination(queue).
// Events with an HTTP endpoint are written to http_deliveries in the same transaction and
// delivered by package delivery with the same operation id as Idempotency-Key.
package outbox

import (
	"cmp"
	"context"
	"crypto/sha1"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"golang.org/x/net/http/httpguts"

	"github.com/idemd/idemd/internal/headerjson"
	"github.com/idemd/idemd/internal/pgarray"
	"github.com/idemd/idemd/internal/pgtext"
	"github.com/idemd/idemd/migrations"
)

// Header names the relay sets on every record.
const (
	HeaderOperationID = "operation-id"
	HeaderCausationID = "causation-id"
	HeaderPipeline    = "idemd-pipeline"
	HeaderContentType = "content-type"
	HeaderEventType   = "event-type"
)

// namespace is the UUIDv5 namespace of operation ids. Never change it: ids computed before
// and after would differ, and a replayed message would look new downstream.
var namespace = uuid.MustParse("6f1c2a8e-3b1d-5c7e-9a40-2d5e8b7c1f03")

// OperationID is the deterministic id of the ordinal-th event caused by message messageID of
// pipeline: the same inputs give the same UUIDv5 on every machine and every replay. It is
// TargetOperationID with the ordinal's decimal digits as the target.
func OperationID(pipeline, messageID string, ordinal int) uuid.UUID {
	var digits [20]byte
	return operationID(pipeline, messageID, strconv.AppendInt(digits[:0], int64(ordinal), 10))
}

// TargetOperationID is the deterministic id of the event that message messageID of pipeline
// (a dedup scope) sends to the publish target named target. A target named by its position
// n ("0", "1"…) gets OperationID(pipeline, messageID, n): the ids of a pipeline's first,
// unnamed target are those of its one event before targets could be several.
func TargetOperationID(pipeline, messageID, target string) uuid.UUID {
	return operationID(pipeline, messageID, []byte(target))
}

func operationID(pipeline, messageID string, target []byte) uuid.UUID {
	// The pipeline is length-prefixed and the target, after the last '/', holds no '/' (a
	// position's digits, or a name of letters, digits, '.', '_' and '-'), so no two
	// different triples share a name. The name is uuid.NewSHA1's, built on the stack (the
	// SHA-1 of namespace and name, version 5, RFC 4122 variant): the same ids without an
	// allocation per event.
	var buf [160]byte
	b := append(buf[:0], namespace[:]...)
	b = strconv.AppendInt(b, int64(len(pipeline)), 10)
	b = append(b, ':')
	b = append(b, pipeline...)
	b = append(b, '/')
	b = append(b, messageID...)
	b = append(b, '/')
	b = append(b, target...)
	sum := sha1.Sum(b)
	var id uuid.UUID
	copy(id[:], sum[:])
	id[6] = (id[6] & 0x0f) | 0x50 // version 5
	id[8] = (id[8] & 0x3f) | 0x80 // RFC 4122 variant
	return id
}

// Event is one record to publish.
type Event struct {
	// Topic is the destination: a Kafka topic, PubSubDestination(topic) or
	// SQSDestination(queue) (see ParseDestination). Required unless Endpoint is set.
	Topic string
	// Endpoint names the HTTP endpoint (a delivery.Endpoint of the same name) the event is
	// POSTed to, beside or instead of Topic. It is written to the http_deliveries table
	// in the same transaction, with the same operation id. Optional.
	Endpoint string
	// Key is the record key; records of one key keep their order. Optional.
	Key []byte
	// Payload is the record value.
	Payload []byte
	// Headers are extra record headers, such as content-type and event-type.
	Headers map[string]string
	// Pipeline names what produced the event (the idemd-pipeline header). Required.
	Pipeline string
	// CausationID is the id of the inbound message that caused the event. Required.
	CausationID string
	// OperationID overrides the computed id. Zero means OperationID(Pipeline, CausationID,
	// i) where i is the event's index in its EnqueueTx call: enqueue all events of one
	// message in one call, always in the same order.
	OperationID uuid.UUID
}

// Config configures a Store.
type Config struct {
	// Schema holds the outbox table. Defaults to "idemd".
	Schema string
	// Handoff, when set, passes the rows written through QueueHanded to the relay of this
	// process once their transaction committed (HandOver), so that a leading relay does not
	// read them back. Give the same Handoff to RelayConfig.Handoff. Optional.
	Handoff *Handoff
}

// Store writes outbox rows into one schema.
type Store struct {
	schema          string
	channel         string
	deliveryChannel string
	// insert, insertReturning: rows of any pipelines, topics and headers; the uniform
	// forms: rows sharing them (the common batch), sent once (uniformInsert).
	insert, insertReturning               string
	insertUniform, insertUniformReturning string
	insertDelivery, insertDeliveryUniform string
	handoff                               *Handoff
	notifySQL                             [4]string
	notifier                              *notifier
}

// New returns a Store for cfg; cfg may be nil.
func New(cfg *Config) *Store {
	if cfg == nil {
		cfg = &Config{}
	}
	schema := cmp.Or(cfg.Schema, migrations.SchemaDefault)
	// The headers go once per distinct value ($8), each row naming its own by index ($7):
	// PostgreSQL parses every element of a jsonb[] parameter, and the events of a batch
	// mostly share their headers (BENCHMARKS.md, phase 17).
	insert := `INSERT INTO ` + pgx.Identifier{schema}.Sanitize() + `.outbox
    (operation_id, pipeline, causation_id, topic, key, payload, headers)
SELECT u.op, u.pipeline, u.causation, u.topic, u.key, u.payload, ($8::jsonb[])[u.h]
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::bytea[], $6::bytea[], $7::int8[])
    AS u (op, pipeline, causation, topic, key, payload, h)`
	// When a batch's rows share their pipeline, topic and headers, as a subscription with
	// one target writes them, those go once as plain parameters: each array element costs
	// PostgreSQL a decode, and each row's subscript of the headers array a copy, about a
	// quarter of the statement's CPU (BENCHMARKS.md, phase 20).
	uniform := `INSERT INTO ` + pgx.Identifier{schema}.Sanitize() + `.outbox
    (operation_id, pipeline, causation_id, topic, key, payload, headers)
SELECT u.op, $2, u.causation, $4, u.key, u.payload, $7::jsonb
FROM unnest($1::uuid[], $3::text[], $5::bytea[], $6::bytea[]) AS u (op, causation, key, payload)`
	return &Store{
		schema:        schema,
		handoff:       cfg.Handoff,
		insert:        insert,
		insertUniform: uniform,
		// The ids come back in the order of the arrays: the rows are inserted, and their
		// identity drawn, in the order unnest returns them (the relay's id order relies on
		// the same).
		insertReturning:        insert + ` RETURNING id`,
		insertUniformReturning: uniform + ` RETURNING id`,
		channel:                Channel(schema),
		deliveryChannel:        DeliveryChannel(schema),
		notifySQL:              notifyStatements(),
		notifier:               &notifier{},
		insertDelivery: `INSERT INTO ` + pgx.Identifier{schema}.Sanitize() + `.http_deliveries
    (endpoint, operation_id, pipeline, causation_id, key, payload, headers)
SELECT u.endpoint, u.op, u.pipeline, u.causation, u.key, u.payload, ($8::jsonb[])[u.h]
FROM unnest($1::text[], $2::uuid[], $3::text[], $4::text[], $5::bytea[], $6::bytea[], $7::int8[])
    AS u (endpoint, op, pipeline, causation, key, payload, h)`,
		// As insertUniform: rows sharing endpoint, pipeline and headers send them once.
		insertDeliveryUniform: `INSERT INTO ` + pgx.Identifier{schema}.Sanitize() + `.http_deliveries
    (endpoint, operation_id, pipeline, causation_id, key, payload, headers)
SELECT $1, u.op, $3, u.causation, u.key, u.payload, $7::jsonb
FROM unnest($2::uuid[], $4::text[], $5::bytea[], $6::bytea[]) AS u (op, causation, key, payload)`,
	}
}

// Default is the Store on the default schema, behind the package-level functions.
var Default = New(nil)

// Channel is the LISTEN/NOTIFY channel that wakes the relay of schema.
func Channel(schema string) string {
	h := fnv.New32a()
	h.Write([]byte(schema))
	return fmt.Sprintf("idemd_outbox_%08x", h.Sum32())
}

// DeliveryChannel is the LISTEN/NOTIFY channel that wakes the HTTP deliverers of schema.
func DeliveryChannel(schema string) string {
	h := fnv.New32a()
	h.Write([]byte(schema))
	return fmt.Sprintf("idemd_delivery_%08x", h.Sum32())
}

// EnqueueTx writes events in tx on the default schema. See Store.EnqueueTx.
func EnqueueTx(ctx context.Context, tx pgx.Tx, events ...Event) error {
	return Default.EnqueueTx(ctx, tx, events...)
}

// EnqueueTx writes events in tx, in one round trip, and notifies the relay at commit. The
// rows become visible to the relay only if tx commits. An event without a traceparent
// header stores the trace context of ctx's span, if any, so that its record continues the
// caller's trace.
func (s *Store) EnqueueTx(ctx context.Context, tx pgx.Tx, events ...Event) error {
	if len(events) == 0 {
		return nil
	}
	events = withTrace(ctx, events)
	batch := &pgx.Batch{}
	if err := s.Queue(batch, events...); err != nil {
		return err
	}
	pgarray.Reserve(tx.Conn(), batch)
	if err := tx.SendBatch(ctx, batch).Close(); err != nil {
		return fmt.Errorf("error enqueueing outbox events: %w", err)
	}
	return nil
}

// Queue adds the statements of EnqueueTx to batch, for callers that pipeline them with
// their own statements. It validates the events first.
func (s *Store) Queue(batch *pgx.Batch, events ...Event) error {
	w, err := s.QueueQuiet(batch, events...)
	if err != nil {
		return err
	}
	s.queueNotify(batch, w)
	return nil
}

// QueueQuiet is Queue without the NOTIFY: it returns the listeners that the caller wakes
// with Notify once its transaction committed. A transaction that notifies holds a
// cluster-wide lock through its commit (see notifier), so a caller that commits many
// concurrent transactions, such as the unit of work, notifies after them instead.
func (s *Store) QueueQuiet(batch *pgx.Batch, events ...Event) (Wake, error) {
	if err := validateAll(events); err != nil {
		return 0, err
	}
	w, _ := s.queue(batch, events, false)
	return w, nil
}

// QueueHanded is QueueQuiet for a Store with a Handoff: when a relay of this process leads,
// the rows' ids are read when batch runs, and the returned Handed carries them; once the
// transaction committed, HandOver passes them to the relay, or the caller wakes it with
// Notify when HandOver returns false. The returned Wake then leaves the relay out. Without
// a Handoff, or while no relay of the process leads, it is QueueQuiet and Handed is nil.
func (s *Store) QueueHanded(batch *pgx.Batch, events ...Event) (Wake, *Handed, error) {
	if err := validateAll(events); err != nil {
		return 0, nil, err
	}
	hand := s.handoff != nil && s.handoff.leadingNow()
	w, h := s.queue(batch, events, hand)
	if h != nil {
		w &^= WakeRelay
	}
	return w, h, nil
}

// HandOver passes the rows of hs, whose transaction committed, to the relay of this
// process. It returns false when it could not (no Handoff, no relay of the process leads any
// more, or it is too far behind): the caller then wakes the relay with Notify(WakeRelay).
func (s *Store) HandOver(hs []*Handed) bool {
	if len(hs) == 0 {
		return true
	}
	return s.handoff != nil && s.handoff.hand(hs)
}

// queue adds the statements that write events to batch. With hand, the outbox insert
// returns the rows' ids into the returned Handed.
func (s *Store) queue(batch *pgx.Batch, events []Event, hand bool) (Wake, *Handed) {
	n := len(events)
	// Operation ids, text and bytea columns go as internal/pgarray's arrays (no reflection
	// and no allocation per element in pgx's encoding), headers as JSON text (no
	// driver.Valuer round trip per element); the stored values are the same.
	var (
		ops        = make([]pgtype.UUID, 0, n)
		pipelines  = make([]string, 0, n)
		causations = make([]string, 0, n)
		topics     = make([]string, 0, n)
		keys       = make([][]byte, 0, n)
		payloads   = make([][]byte, 0, n)
		headers    headerSet
		deliveries deliveryColumns
		handed     []Event
	)
	if hand {
		handed = make([]Event, 0, n)
	}
	for i, e := range events {
		op := e.OperationID
		if op == uuid.Nil {
			op = OperationID(e.Pipeline, e.CausationID, i)
		}
		payload := e.Payload
		if payload == nil {
			payload = []byte{}
		}
		hdrs := storableHeaders(e.Headers)
		if e.Endpoint != "" {
			deliveries.add(e, op, payload, deliverableHeaders(hdrs))
		}
		if e.Topic == "" {
			continue // HTTP only: the relay must never see it
		}
		ops = append(ops, pgtype.UUID{Bytes: op, Valid: true})
		pipelines, causations, topics = append(pipelines, e.Pipeline), append(causations, e.CausationID), append(topics, e.Topic)
		keys, payloads = append(keys, e.Key), append(payloads, payload)
		headers.add(headerjson.String(hdrs))
		if hand {
			// The event as the relay would read its row back.
			handed = append(handed, Event{Topic: e.Topic, Key: e.Key, Payload: payload, Headers: hdrs,
				Pipeline: e.Pipeline, CausationID: e.CausationID, OperationID: op})
		}
	}
	var (
		w Wake
		h *Handed
	)
	if len(ops) > 0 {
		sql, returning := s.insert, s.insertReturning
		var args []any
		if uniformInsert(pipelines, topics, &headers) {
			sql, returning = s.insertUniform, s.insertUniformReturning
			args = []any{pgarray.UUID(ops), pipelines[0], pgarray.Text(causations), topics[0],
				pgarray.Bytes(keys), pgarray.Bytes(payloads), headers.distinct[0]}
		} else {
			args = []any{pgarray.UUID(ops), pgarray.Text(pipelines), pgarray.Text(causations), pgarray.Text(topics),
				pgarray.Bytes(keys), pgarray.Bytes(payloads), headers.index, pgarray.JSONB(headers.distinct)}
		}
		if hand {
			h = &Handed{events: handed, ids: make([]int64, 0, len(handed))}
			batch.Queue(returning, args...).Query(h.scanIDs)
		} else {
			batch.Queue(sql, args...)
		}
		w |= WakeRelay
	}
	if len(deliveries.ops) > 0 {
		d := &deliveries
		if uniformInsert(d.pipelines, d.endpoints, &d.headers) {
			batch.Queue(s.insertDeliveryUniform, d.endpoints[0], pgarray.UUID(d.ops), d.pipelines[0], pgarray.Text(d.causations),
				pgarray.Bytes(d.keys), pgarray.Bytes(d.payloads), d.headers.distinct[0])
		} else {
			batch.Queue(s.insertDelivery, pgarray.Text(d.endpoints), pgarray.UUID(d.ops), pgarray.Text(d.pipelines), pgarray.Text(d.causations),
				pgarray.Bytes(d.keys), pgarray.Bytes(d.payloads), d.headers.index, pgarray.JSONB(d.headers.distinct))
		}
		w |= WakeDeliverers
	}
	return w, h
}

// uniformInsert reports whether the rows of an insert share their pipeline, destination
// (an outbox row's topic, a delivery's endpoint) and headers, so that the insert may send
// each once (Store.insertUniform, Store.insertDeliveryUniform).
func uniformInsert(pipelines, dests []string, headers *headerSet) bool {
	if len(headers.distinct) != 1 {
		return false
	}
	for i := 1; i < len(pipelines); i++ {
		if pipelines[i] != pipelines[0] || dests[i] != dests[0] {
			return false
		}
	}
	return true
}

// headerSet is the headers column of an outbox insert: each distinct JSON value once, and
// per row the (1-based) index of its value.
type headerSet struct {
	distinct []string
	index    pgarray.Int8
	seen     map[string]int64 // from the second distinct value on
}

func (h *headerSet) add(j string) {
	h.index = append(h.index, h.find(j))
}

func (h *headerSet) find(j string) int64 {
	n := len(h.distinct)
	if n > 0 && h.distinct[n-1] == j {
		return int64(n) // a run of one value, the common case
	}
	if i, ok := h.seen[j]; ok {
		return i
	}
	if n == 1 {
		h.seen = map[string]int64{h.distinct[0]: 1}
	}
	h.distinct = append(h.distinct, j)
	if h.seen != nil {
		h.seen[j] = int64(n + 1)
	}
	return int64(n + 1)
}

type deliveryColumns struct {
	endpoints, pipelines, causations []string
	ops                              []pgtype.UUID
	keys, payloads                   [][]byte
	headers                          headerSet
}

func (d *deliveryColumns) add(e Event, op uuid.UUID, payload []byte, headers map[string]string) {
	d.endpoints = append(d.endpoints, e.Endpoint)
	d.ops = append(d.ops, pgtype.UUID{Bytes: op, Valid: true})
	d.pipelines = append(d.pipelines, e.Pipeline)
	d.causations = append(d.causations, e.CausationID)
	d.keys = append(d.keys, e.Key)
	d.payloads = append(d.payloads, payload)
	d.headers.add(headerjson.String(headers))
}

// ErrInvalidEvent: an event lacks what it needs (a topic or endpoint, a pipeline, a
// causation or operation id). Enqueueing it again fails the same way.
var ErrInvalidEvent = errors.New("invalid outbox event")

// validateAll validates events, naming the first invalid one by its index.
func validateAll(events []Event) error {
	for i, e := range events {
		if err := e.validate(); err != nil {
			return fmt.Errorf("outbox: event %d: %w: %w", i, ErrInvalidEvent, err)
		}
	}
	return nil
}

func (e Event) validate() error {
	switch {
	case e.Topic == "" && e.Endpoint == "":
		return fmt.Errorf("topic is required unless an HTTP endpoint is set")
	case e.Topic != "" && destinationName(e.Topic) == "":
		return fmt.Errorf("topic %q names no Pub/Sub topic or SQS queue", e.Topic)
	case e.Pipeline == "":
		return fmt.Errorf("pipeline is required")
	case e.CausationID == "" && e.OperationID == uuid.Nil:
		return fmt.Errorf("causation id (or an explicit operation id) is required")
	}
	return nil
}

func destinationName(topic string) string {
	_, name := ParseDestination(topic)
	return name
}

// deliverableHeaders returns h, or a copy whose values are valid HTTP field values and
// whose names are HTTP tokens: package delivery copies content-type and event-type into its
// requests, and a CR, LF or other control character (a Kafka header or a JSON /type may
// hold any) would fail every attempt before sending, and hold back the key's later events.
// Control characters become spaces; a name that is not a token is dropped. The Kafka
// record keeps the headers as they came.
func deliverableHeaders(h map[string]string) map[string]string {
	for k, v := range h {
		if !httpguts.ValidHeaderFieldName(k) || !httpguts.ValidHeaderFieldValue(v) {
			clean := make(map[string]string, len(h))
			for k, v := range h {
				if httpguts.ValidHeaderFieldName(k) {
					clean[k] = strings.TrimSpace(strings.Map(func(r rune) rune {
						if (r < 0x20 && r != '\t') || r == 0x7f {
							return ' '
						}
						return r
					}, v))
				}
			}
			return clean
		}
	}
	return h
}

// storableHeaders returns h, or a copy with its keys and values made storable in jsonb
// (pgtext.Clean) when a sender put NUL or invalid UTF-8 in them: an event that cannot be
// written would fail its whole transaction again on every retry.
func storableHeaders(h map[string]string) map[string]string {
	if h == nil {
		return map[string]string{}
	}
	for k, v := range h {
		if pgtext.Clean(k) != k || pgtext.Clean(v) != v {
			clean := make(map[string]string, len(h))
			for k, v := range h {
				clean[pgtext.Clean(k)] = pgtext.Clean(v)
			}
			return clean
		}
	}
	return h
}

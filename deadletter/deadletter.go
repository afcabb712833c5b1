// Package deadletter keeps messages whose effect failed permanently, whole (payload,
// headers, where it came from, why it failed), so that an operator can inspect and replay
// them. Guarantee: a dead letter is written in the transaction that marks its message
// processed, so a message is either applied, dead-lettered, or neither — never both, never
// lost; and a letter is replayed at most once (Store.Replay, Replayer).
package deadletter

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/pgtext"
	"github.com/idemd/idemd/migrations"
)

// ErrNotFound: no dead letter has that id.
var ErrNotFound = errors.New("dead letter not found")

// Door names the part of idemd that wrote a letter; it decides how the letter is replayed.
type Door string

// The doors that write dead letters.
const (
	// DoorHTTP: a webhook of a receiver source whose effect failed permanently.
	DoorHTTP Door = "http"
	// DoorKafka: a record of a Kafka subscription (effect failed, or no usable id).
	DoorKafka Door = "kafka"
	// DoorPubSub: a message of a Google Cloud Pub/Sub subscription (effect failed, or no
	// usable id).
	DoorPubSub Door = "pubsub"
	// DoorSQS: a message of an Amazon SQS subscription (effect failed, or no usable id).
	DoorSQS Door = "sqs"
	// DoorRelay: an outbox event the broker refused (too large, topic failing).
	DoorRelay Door = "relay"
	// DoorDelivery: an outbox event an HTTP endpoint refused or never accepted.
	DoorDelivery Door = "delivery"
)

// Origin says where a letter comes from, beside its pipeline.
type Origin struct {
	// Door wrote the letter. Required.
	Door Door
	// OutboxID is the outbox row of a DoorRelay letter; 0 otherwise.
	OutboxID int64
	// DeliveryID is the http_deliveries row of a DoorDelivery letter; 0 otherwise.
	DeliveryID int64
	// OperationID is the outbound event's operation id (DoorRelay, DoorDelivery); zero
	// otherwise.
	OperationID uuid.UUID
}

// HeaderReason is the header a dead-letter topic record carries the reason in.
const HeaderReason = "idemd-dead-letter-reason"

// Letter is one dead-lettered message.
type Letter struct {
	ID       int64
	Pipeline string
	// Origin is the door that wrote the letter and what it stands for.
	Origin    Origin
	Scope     string
	MessageID string
	Payload   []byte
	// Headers are the message's headers (HTTP or Kafka), secrets removed by the door.
	Headers map[string][]string
	// Metadata says more about where the message came from: method and path, or topic,
	// partition and offset.
	Metadata map[string]any
	// Record, when set, is the broker message the letter stands for; its entries are added
	// to Headers and Metadata when the letter is written (Record). Letters read back have
	// them in Headers and Metadata, and Record nil.
	Record *Record
	// Request, when set, is the HTTP request the letter stands for; its method, path and
	// tenant are added to Metadata when the letter is written, as Record's entries are.
	// Letters read back have them in Metadata, and Request nil.
	Request    *Request
	Reason     string
	Attempts   int
	CreatedAt  time.Time
	ReplayedAt *time.Time
}

// Store reads and writes dead letters in one schema.
type Store struct {
	table string
}

// New returns a Store on schema ("" means "idemd").
func New(schema string) *Store {
	return &Store{table: pgx.Identifier{cmp.Or(schema, migrations.SchemaDefault)}.Sanitize() + ".dead_letters"}
}

// WriteTx records l in tx and returns its id.
func (s *Store) WriteTx(ctx context.Context, tx pgx.Tx, l *Letter) (int64, error) {
	sql, args, err := s.insert(l)
	if err != nil {
		return 0, err
	}
	var id int64
	if err := tx.QueryRow(ctx, sql+` RETURNING id`, args...).Scan(&id); err != nil {
		return 0, fmt.Errorf("error writing dead letter: %w", err)
	}
	return id, nil
}

// Queue adds the insert of l to batch, to be sent with the transaction's other statements.
func (s *Store) Queue(batch *pgx.Batch, l *Letter) error {
	sql, args, err := s.insert(l)
	if err != nil {
		return err
	}
	batch.Queue(sql, args...)
	return nil
}

func (s *Store) insert(l *Letter) (string, []any, error) {
	if l.Origin.Door == "" {
		return "", nil, errors.New("deadletter: Origin.Door is required")
	}
	// Headers, ids and reasons come from senders: make them storable as text and jsonb,
	// or the letter could not be written and its message would block its partition.
	hs, meta := l.Headers, l.Metadata
	if l.Record != nil {
		hs, meta = l.Record.expand(l.Origin.Door, hs, meta)
	}
	if l.Request != nil {
		meta = l.Request.expand(meta)
	}
	headers := make(map[string][]string, len(hs))
	for k, vs := range hs {
		clean := make([]string, len(vs))
		for i, v := range vs {
			clean[i] = pgtext.Clean(v)
		}
		headers[pgtext.Clean(k)] = clean
	}
	metadata := make(map[string]any, len(meta))
	for k, v := range meta {
		if s, ok := v.(string); ok {
			v = pgtext.Clean(s)
		}
		metadata[pgtext.Clean(k)] = v
	}
	payload := l.Payload
	if payload == nil {
		payload = []byte{}
	}
	var msgID *string
	if l.MessageID != "" {
		id := pgtext.Clean(l.MessageID)
		msgID = &id
	}
	o := l.Origin
	return `INSERT INTO ` + s.table + ` (pipeline, scope, message_id, payload, headers, metadata, reason, attempts,
    door, outbox_id, delivery_id, operation_id)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`,
		[]any{
			pgtext.Clean(l.Pipeline), pgtext.Clean(l.Scope), msgID, payload, headers, metadata, pgtext.Clean(l.Reason), l.Attempts,
			string(o.Door), nonZero(o.OutboxID), nonZero(o.DeliveryID), nonNilUUID(o.OperationID),
		}, nil
}

func nonZero(n int64) *int64 {
	if n == 0 {
		return nil
	}
	return &n
}

func nonNilUUID(u uuid.UUID) *uuid.UUID {
	if u == uuid.Nil {
		return nil
	}
	return &u
}

// Filter narrows List.
type Filter struct {
	// Pipeline, when set, keeps that pipeline's letters only.
	Pipeline string
	// AfterID pages: letters with a larger id. Defaults to 0.
	AfterID int64
	// Limit bounds the page. Defaults to 100.
	Limit int
	// IncludeReplayed lists letters already replayed too.
	IncludeReplayed bool
}

// List returns dead letters in id order.
func (s *Store) List(ctx context.Context, pool *pgxpool.Pool, f Filter) ([]*Letter, error) {
	rows, err := pool.Query(ctx, `SELECT `+columns+` FROM `+s.table+`
WHERE ($1 = '' OR pipeline = $1) AND id > $2 AND ($3 OR replayed_at IS NULL)
ORDER BY id LIMIT $4`, f.Pipeline, f.AfterID, f.IncludeReplayed, cmp.Or(f.Limit, 100))
	if err != nil {
		return nil, fmt.Errorf("error listing dead letters: %w", err)
	}
	return pgx.CollectRows(rows, scan)
}

// GetTx loads one letter and locks it for the rest of tx (replays of one letter serialize).
func (s *Store) GetTx(ctx context.Context, tx pgx.Tx, id int64) (*Letter, error) {
	rows, err := tx.Query(ctx, `SELECT `+columns+` FROM `+s.table+` WHERE id = $1 FOR UPDATE`, id)
	if err != nil {
		return nil, fmt.Errorf("error loading dead letter %d: %w", id, err)
	}
	l, err := pgx.CollectExactlyOneRow(rows, scan)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("dead letter %d: %w", id, ErrNotFound)
	}
	return l, err
}

// MarkReplayedTx records that letter id was replayed.
func (s *Store) MarkReplayedTx(ctx context.Context, tx pgx.Tx, id int64) error {
	if _, err := tx.Exec(ctx, `UPDATE `+s.table+` SET replayed_at = now() WHERE id = $1`, id); err != nil {
		return fmt.Errorf("error marking dead letter %d replayed: %w", id, err)
	}
	return nil
}

const columns = `id, pipeline, scope, coalesce(message_id, ''), payload, headers, metadata, reason, attempts, created_at, replayed_at,
    door, coalesce(outbox_id, 0), coalesce(delivery_id, 0), coalesce(operation_id, '00000000-0000-0000-0000-000000000000'::uuid)`

func scan(row pgx.CollectableRow) (*Letter, error) {
	var l Letter
	var door string
	err := row.Scan(&l.ID, &l.Pipeline, &l.Scope, &l.MessageID, &l.Payload, &l.Headers, &l.Metadata,
		&l.Reason, &l.Attempts, &l.CreatedAt, &l.ReplayedAt,
		&door, &l.Origin.OutboxID, &l.Origin.DeliveryID, &l.Origin.OperationID)
	l.Origin.Door = Door(door)
	return &l, err
}

// ErrAlreadyReplayed: the dead letter was replayed before; it is not run again.
var ErrAlreadyReplayed = errors.New("dead letter already replayed")

// Replay runs fn on letter id exactly once: in one transaction it locks the letter, refuses
// it with ErrAlreadyReplayed when it was replayed before, runs fn (the door's effect, a
// requeue…) and marks the letter replayed. When fn fails nothing commits and the letter stays
// as it was, to be replayed after a further fix.
func (s *Store) Replay(ctx context.Context, pool *pgxpool.Pool, id int64, fn func(ctx context.Context, tx pgx.Tx, l *Letter) error) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		l, err := s.GetTx(ctx, tx, id)
		if err != nil {
			return err
		}
		if l.ReplayedAt != nil {
			return fmt.Errorf("dead letter %d: %w", id, ErrAlreadyReplayed)
		}
		if err := fn(ctx, tx, l); err != nil {
			return err
		}
		return s.MarkReplayedTx(ctx, tx, id)
	})
}

package effectsql

import (
	"context"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/internal/headerjson"
)

// Statement is a compiled effect: positional SQL and the parameter behind each $n.
type Statement struct {
	// SQL is the statement with $1, $2… in place of its named parameters.
	SQL string
	// Params names the parameter of each position, in order.
	Params []string
	// Many is SQL rewritten to apply the effects of many messages in one statement, whose
	// $n is an array of the $n of each message, in order; "" when SQL is not a statement
	// that can be rewritten so (see manyOf). exactlyonce.Effect.Many.
	Many string
}

// Prepare is Compile returning a Statement, with its multi-message form when it has one
// (checked to prepare too).
func Prepare(ctx context.Context, conn *pgx.Conn, sql string) (*Statement, error) {
	positional, names, oids, err := compile(ctx, conn, sql)
	if err != nil {
		return nil, err
	}
	st := &Statement{SQL: positional, Params: names}
	// Without a multi-message form (or when reading the table failed), the effect runs
	// once per message, as written.
	if many, err := manyOf(ctx, conn, positional, oids); err == nil && many != "" {
		if _, err := conn.PgConn().Prepare(ctx, "", many, nil); err == nil {
			st.Many = many
		}
	}
	return st, nil
}

// Values are what a door knows of one message: the sources of the SPEC 2.3 parameters.
type Values struct {
	MessageID string
	Payload   []byte
	// Headers are the message's headers (first value of each), as @headers' JSON object.
	Headers map[string]string
	Source  string
	// Tenant is the API tenant; "" binds NULL.
	Tenant string
	// Key is the record key or the Idempotency-Key; nil binds NULL.
	Key []byte
	// Position says where a broker record was read; the zero Position (no Topic) binds
	// @topic, @partition and @offset to NULL (HTTP requests). A value, not a pointer: Bind
	// leaks v's content, which would move a Position of every message to the heap.
	Position Position
	// ReceivedAt is when the door received the message.
	ReceivedAt time.Time
}

// Position locates a broker record.
type Position struct {
	Topic     string
	Partition int
	Offset    int64
}

// Bind returns the arguments of s for v, in the order of its positional parameters: the one
// place where the SPEC 2.3 parameters get their values. Only the parameters s uses are
// computed.
func (s *Statement) Bind(v *Values) []any {
	return s.AppendArgs(nil, v)
}

// AppendArgs is Bind appending the arguments to dst, so that a caller may give them room it
// has already allocated (cap(dst) - len(dst) >= len(s.Params): no allocation for the slice).
func (s *Statement) AppendArgs(dst []any, v *Values) []any {
	n := len(dst)
	dst = slices.Grow(dst, len(s.Params))[:n+len(s.Params)]
	args := dst[n:]
	clear(args)
	for i, name := range s.Params {
		switch name {
		case "message_id":
			args[i] = v.MessageID
		case "payload":
			args[i] = string(v.Payload)
		case "headers":
			args[i] = headerjson.String(v.Headers) // "{}" for none
		case "source":
			args[i] = v.Source
		case "tenant":
			if v.Tenant != "" {
				args[i] = v.Tenant
			}
		case "key":
			if v.Key != nil {
				args[i] = string(v.Key)
			}
		case "topic":
			if v.Position.Topic != "" {
				args[i] = v.Position.Topic
			}
		case "partition":
			if v.Position.Topic != "" {
				args[i] = v.Position.Partition
			}
		case "offset":
			if v.Position.Topic != "" {
				args[i] = v.Position.Offset
			}
		case "received_at":
			args[i] = v.ReceivedAt
		}
	}
	return dst
}

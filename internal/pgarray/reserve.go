package pgarray

import (
	"encoding/json"
	"errors"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"
)

// pgx keeps two buffers per connection that a batch of large arrays outgrows, and lets
// both go once they have grown: the parameter buffer that a statement's arguments are
// encoded into (cut back to 256 bytes when the next statement is built), and the write
// buffer that the batch's messages are copied into (cut back to 1 KiB after each flush).
// So each statement's arrays, and then the batch's messages, were built up by doubling
// from those sizes, batch after batch: a third of the bytes the consumer's process
// allocated (BENCHMARKS.md, phases 14 and 35). Reserve sizes both once, from the arrays
// the batch holds, and makes them the connection's own, kept from batch to batch
// (paramBuffer): pgx is done with a statement's parameter bytes once it has copied them
// into the write buffer, and with the write buffer once it has written it to the
// connection, so the next statement, and the next batch, go into the same bytes
// (BENCHMARKS.md, phase 36).

// paramBufferKept and writeBufferKept are the sizes pgx cuts its buffers back to
// (pgx.ExtendedQueryBuilder, pgproto3.Frontend.Flush): below them there is nothing to
// reserve.
const (
	paramBufferKept = 256
	writeBufferKept = 1024
)

// bindOverhead is a generous bound on what a statement's messages in a batch add to its
// arguments: Bind (with the prepared statement's name and the formats), Describe and
// Execute; paramOverhead, each argument's length word and format code.
const (
	bindOverhead  = 160
	paramOverhead = 6
)

// Reserve readies conn to send b, a batch of statements, with its buffers grown once and
// kept: the batch's messages go into the connection's own write buffer, and the first array
// argument of each statement that holds arrays (one of this package's, or a []any column)
// moves pgx's parameter buffer into the connection's own, with room for all of that
// statement's arguments. Call it just before conn.SendBatch(ctx, b) (or the SendBatch of a
// transaction on conn), and send b on conn only. It changes no byte that reaches
// PostgreSQL. The arguments are left as they are where Register did not run on conn, and
// where pgx does not encode them by the statement's description (a DefaultQueryExecMode of
// QueryExecModeExec or the simple protocol, which a batch's statements all run in): there
// pgx takes an argument's type from its Go value.
func Reserve(conn *pgx.Conn, b *pgx.Batch) {
	if conn == nil {
		return
	}
	bufs := buffersOf(conn)
	wrap := Registered(conn.TypeMap()) && bufs.described
	var params *paramBuffer
	if wrap {
		params = bufs.params
	}
	total := 0
	for _, q := range b.QueuedQueries {
		n, first := 0, -1
		for i, arg := range q.Arguments {
			if r, ok := arg.(reservedArg); ok {
				arg = r.inner() // a batch sent before: reserved again below
			}
			switch v := arg.(type) {
			case binaryArray:
				s, _ := v.size()
				n += arrayHeaderLen + s
				if first < 0 && !v.null() {
					first = i
				}
			case []any:
				n += arrayHeaderLen
				for _, e := range v {
					switch e := e.(type) {
					case string:
						n += 4 + 1 + len(e) // jsonb's version byte, at most
					case []byte:
						n += 4 + len(e)
					case nil:
						n += 4
					default:
						n += 4 + 16 // at most a uuid's or an interval's 16 bytes
					}
				}
				if first < 0 && v != nil {
					first = i
				}
			case string:
				n += len(v)
			case []byte:
				n += len(v)
			default:
				n += 16 // a scalar: at most a uuid's or an interval's 16 bytes
			}
		}
		if wrap && first >= 0 && n > paramBufferKept {
			// The caller's slice of arguments is left as it was.
			args := slices.Clone(q.Arguments)
			for i, arg := range args {
				if r, ok := arg.(reservedArg); ok {
					args[i] = r.inner()
				}
			}
			args[first] = reserve(args[first], n, params)
			q.Arguments = args
		}
		total += bindOverhead + paramOverhead*len(q.Arguments) + n
	}
	if total > writeBufferKept {
		conn.PgConn().Frontend().Send(reserveMessage{n: total, buf: bufs.write})
	}
}

// described says whether pgx encodes a statement's arguments, in mode, by the types of the
// statement's description.
func described(mode pgx.QueryExecMode) bool {
	switch mode {
	case pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec:
		return true
	}
	return false
}

// reservation is an array argument (one of this package's arrays, or a []any column) that
// moves pgx's parameter buffer into its connection's (params), with room for n bytes, the
// encoded size of its statement's arguments, before it is encoded as it would be alone.
// Register has pgx unwrap it for any parameter type (tryWrapReserved): a parameter of a
// type whose codec takes any Go value, json or jsonb, marshals it as the array inside
// (MarshalJSON). It is generic so that pgx, which keeps one plan per Go type, plans each
// kind of array inside for itself.
type reservation[T any] struct {
	v      T
	n      int
	params *paramBuffer
}

// reservedArg is a reservation of any array type.
type reservedArg interface {
	inner() any
	take(buf []byte) []byte
}

func (r reservation[T]) inner() any                   { return r.v }
func (r reservation[T]) take(buf []byte) []byte       { return r.params.take(buf, r.n) }
func (r reservation[T]) MarshalJSON() ([]byte, error) { return json.Marshal(r.v) }

// reserve wraps arg, a binaryArray or a []any, in its reservation.
func reserve(arg any, n int, params *paramBuffer) any {
	switch v := arg.(type) {
	case Text:
		return reservation[Text]{v, n, params}
	case JSONB:
		return reservation[JSONB]{v, n, params}
	case Bytes:
		return reservation[Bytes]{v, n, params}
	case UUID:
		return reservation[UUID]{v, n, params}
	case Int8:
		return reservation[Int8]{v, n, params}
	case []any:
		return reservation[[]any]{v, n, params}
	}
	return arg // an array type Reserve does not know: left as it is
}

// tryWrapReserved is a pgtype.TryWrapEncodePlanFunc: a reservation is encoded by the plan of
// the array inside, once the parameter buffer is the connection's.
func tryWrapReserved(value any) (pgtype.WrappedEncodePlanNextSetter, any, bool) {
	if r, ok := value.(reservedArg); ok {
		return &reservePlan{}, r.inner(), true
	}
	return nil, nil, false
}

type reservePlan struct{ next pgtype.EncodePlan }

func (p *reservePlan) SetNext(next pgtype.EncodePlan) { p.next = next }

func (p *reservePlan) Encode(value any, buf []byte) ([]byte, error) {
	r := value.(reservedArg)
	return p.next.Encode(r.inner(), r.take(buf))
}

// paramBuffer is a buffer of a connection that pgx encodes into and lets go of: the
// parameter buffer, or the write buffer. Each is kept in the connection's CustomData for
// as long as the connection lives, and is only used on it, one statement or batch at a
// time (a connection runs one at a time).
//   - Parameters: pgx encodes a statement's arguments into a buffer of its own
//     (ExtendedQueryBuilder), which it cuts back to 256 bytes before the next statement is
//     built, and copies them into its write buffer (Frontend.SendBind) before it builds
//     the next. So once a statement is built, the bytes its arguments were encoded into
//     are free: the next statement on the connection encodes into them again.
//   - Messages: pgx writes its write buffer to the connection when it flushes (a batch's
//     Sync), synchronously, and then cuts it back to 1 KiB: the next batch's messages go
//     into the same bytes again. Where pgx keeps it instead (a flush of 1 KiB or less, or
//     an encoding error), it is the connection's own write buffer, used by it alone.
//
// A buffer above paramBufferMax (1 MiB) is not kept: one huge batch must not pin its memory,
// and a pool of the daemon's 20 connections keeps at most 40 MiB.
type paramBuffer struct{ b []byte }

// buffers are a connection's two paramBuffers: pgx copies one into the other. Both are nil
// (pgx's buffers grown once, not kept) where the connection has no CustomData (a PgConn
// built from a hijacked connection without one).
type buffers struct {
	params, write *paramBuffer
	// described says that the connection's DefaultQueryExecMode encodes arguments by the
	// statement's description (see Reserve). It is read once per connection, whose
	// configuration does not change: Conn.Config copies it, a few allocations a call.
	described bool
}

const (
	buffersKey     = "idemd/pgarray.buffers"
	paramBufferMax = 1 << 20
)

// buffersOf is conn's buffers, made on first use.
func buffersOf(conn *pgx.Conn) buffers {
	data := conn.PgConn().CustomData()
	if b, ok := data[buffersKey].(buffers); ok {
		return b
	}
	b := buffers{described: described(conn.Config().DefaultQueryExecMode)}
	if data != nil {
		b.params, b.write = &paramBuffer{}, &paramBuffer{}
		data[buffersKey] = b
	}
	return b
}

// take returns a buffer that holds prefix (what the statement's earlier arguments encoded
// into pgx's buffer) and has room for n more bytes: the connection's, unless that would
// be larger than paramBufferMax.
func (p *paramBuffer) take(prefix []byte, n int) []byte {
	size := len(prefix) + n
	if p == nil || size > paramBufferMax {
		return slices.Grow(prefix, n)
	}
	if cap(p.b) < size {
		p.b = make([]byte, 0, size)
	}
	return append(p.b[:0], prefix...)
}

// reserveMessage is a message to the server of no bytes: sent, it moves the connection's
// write buffer into buf, with room for n more bytes.
type reserveMessage struct {
	n   int
	buf *paramBuffer
}

func (reserveMessage) Frontend() {}

func (m reserveMessage) Encode(dst []byte) ([]byte, error) { return m.buf.take(dst, m.n), nil }

func (reserveMessage) Decode([]byte) error {
	return errors.New("pgarray: a reservation is not a message to decode")
}

var _ pgproto3.FrontendMessage = reserveMessage{}

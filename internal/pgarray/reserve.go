package pgarray

import (
	"errors"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
)

// pgx keeps two buffers per connection that a batch of large arrays outgrows, and lets
// both go once they have grown: the parameter buffer that a statement's arguments are
// encoded into (cut back to 256 bytes when the next statement is built), and the write
// buffer that the batch's messages are copied into (cut back to 1 KiB after each flush).
// So each statement's arrays, and then the batch's messages, were built up by doubling
// from those sizes, batch after batch: a third of the bytes the consumer's process
// allocated (BENCHMARKS.md, phases 14 and 35). Reserve sizes both once, from the arrays
// the batch holds.

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

// Reserve readies conn to send b, a batch of statements, with its buffers grown once: the
// write buffer gets room for the batch's messages, and the first array argument of each
// statement that holds arrays reserves room in pgx's parameter buffer for all of that
// statement's arguments. Call it just before conn.SendBatch(ctx, b) (or the SendBatch of a
// transaction on conn). It changes no byte that reaches PostgreSQL. The arguments are left
// as they are where Register did not run on conn, and where pgx does not encode them by
// the statement's description (a DefaultQueryExecMode of QueryExecModeExec or the simple
// protocol, which a batch's statements all run in): there pgx takes an argument's type
// from its Go value.
func Reserve(conn *pgx.Conn, b *pgx.Batch) {
	if conn == nil {
		return
	}
	// Config copies the connection's configuration: a few allocations a batch.
	wrap := Registered(conn.TypeMap()) && described(conn.Config().DefaultQueryExecMode)
	total := 0
	for _, q := range b.QueuedQueries {
		n, first := 0, -1
		for i, arg := range q.Arguments {
			if r, ok := arg.(reserved); ok {
				arg = r.binaryArray // a batch sent before: reserved again below
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
					s, _ := e.(string)
					n += 4 + 1 + len(s) // jsonb's version byte, at most
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
				if r, ok := arg.(reserved); ok {
					args[i] = r.binaryArray
				}
			}
			args[first] = reserved{binaryArray: args[first].(binaryArray), n: n}
			q.Arguments = args
		}
		total += bindOverhead + paramOverhead*len(q.Arguments) + n
	}
	if total > writeBufferKept {
		conn.PgConn().Frontend().Send(reserveMessage(total))
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

// reserved is an array argument that grows pgx's parameter buffer by n bytes, the encoded
// size of its statement's arguments, before it encodes itself.
type reserved struct {
	binaryArray
	n int
}

// reserveMessage is a message to the server of no bytes: sent, it grows the connection's
// write buffer by its value.
type reserveMessage int

func (reserveMessage) Frontend() {}

func (n reserveMessage) Encode(dst []byte) ([]byte, error) { return slices.Grow(dst, int(n)), nil }

func (reserveMessage) Decode([]byte) error {
	return errors.New("pgarray: a reservation is not a message to decode")
}

var _ pgproto3.FrontendMessage = reserveMessage(0)

// Package effectsql compiles the effect SQL of pipelines: statements with pgx named
// parameters (@message_id, @payload…) that run in the dedup transaction. It is the one
// place that knows the parameter names of SPEC 2.3 and how a statement is checked: rewritten
// to positional parameters as pgx does when it runs, then parsed and described by the server,
// so that a statement that cannot run is refused at start, not at the first message.
package effectsql

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Params are the named parameters an effect may use (SPEC 2.3).
var Params = []string{"message_id", "payload", "headers", "source", "tenant", "key", "topic", "partition", "offset", "received_at"}

// ErrUnknownParameter: the statement names a parameter that is not one of Params.
var ErrUnknownParameter = errors.New("unknown parameter")

var paramRef = regexp.MustCompile(`@([A-Za-z_][A-Za-z0-9_]*)`)

// Compile rewrites sql's named parameters to positional ones, refuses names not in Params
// (ErrUnknownParameter), and has conn's server prepare the result as its unnamed statement,
// which leaves nothing behind. It returns the positional SQL and the names of its $1, $2…
// in order. A statement that does not prepare returns the server's error unwrapped.
func Compile(ctx context.Context, conn *pgx.Conn, sql string) (positional string, names []string, err error) {
	positional, names, _, err = compile(ctx, conn, sql)
	return positional, names, err
}

// compile is Compile that also returns the type of each parameter.
func compile(ctx context.Context, conn *pgx.Conn, sql string) (positional string, names []string, oids []uint32, err error) {
	named := pgx.NamedArgs{}
	for _, p := range Params {
		named[p] = p
	}
	positional, args, err := named.RewriteQuery(ctx, conn, sql, nil)
	if err != nil {
		return "", nil, nil, err
	}
	if slices.Contains(args, nil) {
		var unknown []string
		for _, m := range paramRef.FindAllStringSubmatch(sql, -1) {
			if _, ok := named[m[1]]; !ok && !slices.Contains(unknown, "@"+m[1]) {
				unknown = append(unknown, "@"+m[1])
			}
		}
		return "", nil, nil, fmt.Errorf("%w %s (known: @%s)", ErrUnknownParameter, strings.Join(unknown, ", "), strings.Join(Params, ", @"))
	}
	sd, err := conn.PgConn().Prepare(ctx, "", positional, nil)
	if err != nil {
		return "", nil, nil, err
	}
	names = make([]string, len(args))
	for i, a := range args {
		names[i] = a.(string)
	}
	return positional, names, sd.ParamOIDs, nil
}

package effectsql

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The effect of most pipelines is one row inserted per message. Run once per message, it
// costs PostgreSQL a statement per message (about half of the SQL limit's time in
// idemd-bench); run once per batch over arrays, as unnest, it costs one. manyOf rewrites
// such a statement, when the rewriting provably does what the statements one after another
// would do:
//
//	INSERT INTO t [AS a] [(c1, c2…)] VALUES (v1, v2…) [ON CONFLICT [(…) | ON CONSTRAINT x] DO NOTHING]
//
// where every value is a parameter, a cast of one, or a constant (a number, a string, NULL,
// TRUE, FALSE), with no RETURNING, no subquery, no function call, into a plain or
// partitioned table without rules or statement-level triggers (which would fire once
// instead of once per message). Rows are inserted in the messages' order (WITH ORDINALITY);
// row triggers, defaults, sequences, constraints and DO NOTHING see them as they would one
// statement after another. Anything else keeps a statement per message.

var (
	ident     = `(?:"(?:[^"]|"")+"|[A-Za-z_][A-Za-z0-9_$]*)`
	qualified = ident + `(?:\s*\.\s*` + ident + `){0,2}`
	identList = `\(\s*` + ident + `(?:\s*,\s*` + ident + `)*\s*\)`
	typeName  = ident + `(?:\s*\.\s*` + ident + `)?(?:\s+[A-Za-z_][A-Za-z0-9_]*)*(?:\s*\(\s*\d+(?:\s*,\s*\d+)?\s*\))?(?:\s*\[\s*\])*`
	constant  = `(?:-?\d+(?:\.\d+)?|'(?:[^']|'')*'|(?i:NULL|TRUE|FALSE))`
	value     = `(?:\$\d+|` + constant + `)(?:\s*::\s*` + typeName + `)*`

	singleInsert = regexp.MustCompile(`(?is)^\s*INSERT\s+INTO\s+(` + qualified + `(?:\s+AS\s+` + ident + `)?)\s*(` + identList + `)?\s*` +
		`VALUES\s*\(\s*(` + value + `(?:\s*,\s*` + value + `)*)\s*\)\s*` +
		`(ON\s+CONFLICT\s*(?:` + identList + `|ON\s+CONSTRAINT\s+` + ident + `)?\s*DO\s+NOTHING)?\s*;?\s*$`)
	target        = regexp.MustCompile(`(?is)^(` + qualified + `)`)
	valueRe       = regexp.MustCompile(`(?s)` + value)
	positionalRef = regexp.MustCompile(`\$(\d+)`)
)

// manyOf returns the multi-message rewriting of positional (see above), whose parameter n
// has the type oids[n-1], or "" when there is none. The result's $n is an array of the
// $n of each message, in order.
func manyOf(ctx context.Context, conn *pgx.Conn, positional string, oids []uint32) (string, error) {
	m := singleInsert.FindStringSubmatch(positional)
	if m == nil || len(oids) == 0 {
		return "", nil
	}
	into, cols, values, conflict := m[1], m[2], m[3], m[4]
	ok, err := plainTable(ctx, conn, target.FindString(into))
	if err != nil || !ok {
		return "", err
	}
	types := make([]string, len(oids))
	for i, oid := range oids {
		var name string
		var isArray bool
		if err := conn.QueryRow(ctx, `SELECT format_type($1, NULL), typcategory = 'A' FROM pg_type WHERE oid = $1`, oid).Scan(&name, &isArray); err != nil {
			return "", fmt.Errorf("effectsql: type of parameter $%d: %w", i+1, err)
		}
		if isArray {
			return "", nil // unnest would flatten an array of arrays
		}
		types[i] = name
	}
	items := valueRe.FindAllString(values, -1)
	for i, item := range items {
		// Only a value's leading $n is a parameter; one inside a string constant is text.
		if loc := positionalRef.FindStringSubmatchIndex(item); loc != nil && loc[0] == 0 {
			items[i] = "u.p" + item[loc[2]:loc[3]] + item[loc[1]:]
		}
	}
	arrays, names := make([]string, len(oids)), make([]string, len(oids))
	for i, t := range types {
		arrays[i] = "$" + strconv.Itoa(i+1) + "::" + t + "[]"
		names[i] = "p" + strconv.Itoa(i+1)
	}
	var b strings.Builder
	b.WriteString("INSERT INTO " + into)
	if cols != "" {
		b.WriteString(" " + cols)
	}
	b.WriteString(" SELECT " + strings.Join(items, ", "))
	b.WriteString(" FROM unnest(" + strings.Join(arrays, ", ") + ") WITH ORDINALITY AS u(" + strings.Join(names, ", ") + ", ord)")
	b.WriteString(" ORDER BY u.ord")
	if conflict != "" {
		b.WriteString(" " + conflict)
	}
	return b.String(), nil
}

// plainTable reports whether name (as written in the statement, resolved on conn's
// search_path) is a plain or partitioned table without rules or statement-level triggers.
func plainTable(ctx context.Context, conn *pgx.Conn, name string) (bool, error) {
	var ok bool
	err := conn.QueryRow(ctx, `SELECT c.relkind IN ('r', 'p')
       AND NOT EXISTS (SELECT 1 FROM pg_rewrite r WHERE r.ev_class = c.oid)
       AND NOT EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = c.oid AND NOT t.tgisinternal AND (t.tgtype & 1) = 0)
FROM pg_class c WHERE c.oid = to_regclass($1)`, name).Scan(&ok)
	if err == pgx.ErrNoRows {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("effectsql: reading table %s: %w", name, err)
	}
	return ok, nil
}

// Package sqlwhere builds the WHERE clause of a filtered list query: each condition is
// added with its argument, and the placeholders are numbered in order. Values always travel
// as parameters, never inside the SQL text.
package sqlwhere

import (
	"strconv"
	"strings"
)

// Where is a conjunction of conditions and their arguments.
type Where struct {
	conds []string
	args  []any
}

// Add appends cond, in which every "?" stands for the next of args.
func (w *Where) Add(cond string, args ...any) {
	var b strings.Builder
	for _, r := range cond {
		if r == '?' && len(args) > 0 {
			w.args = append(w.args, args[0])
			args = args[1:]
			b.WriteString("$" + strconv.Itoa(len(w.args)))
			continue
		}
		b.WriteRune(r)
	}
	w.conds = append(w.conds, b.String())
}

// Arg adds a value without a condition (for LIMIT) and returns its placeholder.
func (w *Where) Arg(v any) string {
	w.args = append(w.args, v)
	return "$" + strconv.Itoa(len(w.args))
}

// SQL is " WHERE c1 AND c2…", or "" without conditions.
func (w *Where) SQL() string {
	if len(w.conds) == 0 {
		return ""
	}
	return " WHERE " + strings.Join(w.conds, " AND ")
}

// Args are the arguments in placeholder order.
func (w *Where) Args() []any { return w.args }

// Like escapes s for a LIKE pattern (with the default escape character).
func Like(s string) string {
	return strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(s)
}

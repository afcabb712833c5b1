package outbox

import (
	"slices"

	"github.com/idemd/idemd/internal/pgarray"
)

// byIDs is one statement on a set of outbox rows, in the three forms the set may take. The
// relay deletes (or marks) the rows it published by id, most often a run of consecutive ids
// or one with a few ids missing. PostgreSQL up to version 16 descends the index once for
// each element of `id = ANY($1)`, which with a thousand ids is a few thousand buffer
// accesses; a range is one descent and a walk along the leaves (idemd-bench counts the
// buffers: BENCHMARKS.md, phase 16).
type byIDs struct {
	// anyOf has the ids as $1; between the first and the last as $1 and $2; except those
	// two and, as $3, the ids between them that are not in the set.
	anyOf, between, except string
}

// byIDsMissingMax bounds the ids missing from a range that the except form leaves out:
// each row of the range is compared with each of them.
const byIDsMissingMax = 16

// newByIDs returns head + (the set's condition) + tail in the three forms.
func newByIDs(head, tail string) byIDs {
	return byIDs{
		anyOf:   head + `id = ANY($1)` + tail,
		between: head + `id BETWEEN $1 AND $2` + tail,
		except:  head + `id BETWEEN $1 AND $2 AND id <> ALL($3)` + tail,
	}
}

// forIDs returns the form of the statement for ids, which are not empty, and its
// arguments. ids is left as it is.
func (s byIDs) forIDs(ids []int64) (string, []any) {
	if !increasing(ids) {
		ids = slices.Compact(slices.Sorted(slices.Values(ids)))
	}
	missing, ok := gapsBetween(ids, byIDsMissingMax)
	switch {
	case !ok:
		return s.anyOf, []any{pgarray.Int8(ids)}
	case len(missing) == 0:
		return s.between, []any{ids[0], ids[len(ids)-1]}
	}
	return s.except, []any{ids[0], ids[len(ids)-1], pgarray.Int8(missing)}
}

// increasing reports whether ids are sorted and distinct.
func increasing(ids []int64) bool {
	for i := 1; i < len(ids); i++ {
		if ids[i] <= ids[i-1] {
			return false
		}
	}
	return true
}

package outbox

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgarray"
	"github.com/idemd/idemd/internal/pgtest"
)

// TestByIDsForms: a run of ids is a range, a run with a few ids missing a range without
// them, anything else the ids themselves; the caller's slice is left as it was.
func TestByIDsForms(t *testing.T) {
	s := newByIDs("H ", " T")
	many := make([]int64, 0, 20)
	for id := int64(100); id < 140; id += 2 {
		many = append(many, id)
	}
	unsorted := []int64{7, 5, 6, 5, 9}
	for _, c := range []struct {
		name string
		ids  []int64
		sql  string
		args []any
	}{
		{"one", []int64{42}, "H id BETWEEN $1 AND $2 T", []any{int64(42), int64(42)}},
		{"a run", []int64{3, 4, 5, 6}, "H id BETWEEN $1 AND $2 T", []any{int64(3), int64(6)}},
		{"a run with two missing", []int64{3, 5, 6, 8}, "H id BETWEEN $1 AND $2 AND id <> ALL($3) T",
			[]any{int64(3), int64(8), pgarray.Int8([]int64{4, 7})}},
		{"unsorted, repeated", unsorted, "H id BETWEEN $1 AND $2 AND id <> ALL($3) T",
			[]any{int64(5), int64(9), pgarray.Int8([]int64{8})}},
		{"too many missing", many, "H id = ANY($1) T", []any{pgarray.Int8(many)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := slices.Clone(c.ids)
			sql, args := s.forIDs(c.ids)
			require.Equal(t, c.sql, sql)
			require.Equal(t, c.args, args)
			require.Equal(t, before, c.ids, "the caller's ids are not changed")
		})
	}
}

// TestByIDsDeletesExactlyTheSet: each form deletes the rows of its ids and no other, among
// rows whose ids interleave with them, and the two range forms walk one range of the
// primary key rather than probing it once per id. With KeepPublished the same rows, and
// only they, move to outbox_published, whole.
func TestByIDsDeletesExactlyTheSet(t *testing.T) {
	t.Parallel()
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprintf("keep=%v", keep), func(t *testing.T) {
			t.Parallel()
			testByIDsMarks(t, keep)
		})
	}
}

func testByIDsMarks(t *testing.T, keep bool) {
	db := pgtest.New(t)
	ctx := context.Background()
	table := pgx.Identifier{db.Schema}.Sanitize() + ".outbox"
	del := markByIDs(db.Schema, keep, ` AND published_at IS NULL`, `id`)
	for _, c := range []struct {
		name string
		pick func(ids []int64) []int64 // the ids to delete, of 60 rows
		plan string
	}{
		{"a run", func(ids []int64) []int64 { return ids[10:30] }, "Index Cond: ((id >= "},
		{"a run with some missing", func(ids []int64) []int64 {
			return slices.Concat(ids[10:20], ids[21:25], ids[30:40])
		}, "Index Cond: ((id >= "},
		{"scattered", func(ids []int64) []int64 {
			var out []int64
			for i := 0; i < len(ids); i += 3 {
				out = append(out, ids[i])
			}
			return out
		}, "Index Cond: (id = ANY ("},
	} {
		t.Run(c.name, func(t *testing.T) {
			var all []int64
			rows, err := db.Pool.Query(ctx, `INSERT INTO `+table+` (operation_id, pipeline, causation_id, topic, payload)
SELECT gen_random_uuid(), 'p', 'c' || g, 't', '\x00' FROM generate_series(1, 60) g RETURNING id`)
			require.NoError(t, err)
			all, err = pgx.CollectRows(rows, pgx.RowTo[int64])
			require.NoError(t, err)
			slices.Sort(all)
			want := c.pick(all)
			sql, args := del.forIDs(want)
			require.Contains(t, db.Plan(t, sql, args...), c.plan, "the form's plan")
			rows, err = db.Pool.Query(ctx, sql, args...)
			require.NoError(t, err)
			got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			require.NoError(t, err)
			slices.Sort(got)
			require.Equal(t, want, got, "deleted")
			left := db.Count(t, db.Q(`{schema}.outbox WHERE id BETWEEN $1 AND $2`), all[0], all[len(all)-1])
			require.Equal(t, len(all)-len(want), left, fmt.Sprintf("the other %d rows stay", len(all)-len(want)))
			if keep {
				rows, err = db.Pool.Query(ctx, db.Q(`SELECT p.id FROM {schema}.outbox_published p
WHERE p.causation_id = 'c' || (p.id - $1 + 1) AND p.topic = 't' AND p.payload = '\x00' AND p.published_at > now() - interval '1 minute'`), all[0])
				require.NoError(t, err)
				moved, err := pgx.CollectRows(rows, pgx.RowTo[int64])
				require.NoError(t, err)
				slices.Sort(moved)
				require.Equal(t, want, moved, "moved whole to outbox_published")
				db.Exec(t, db.Q(`DELETE FROM {schema}.outbox_published`))
			} else {
				require.Zero(t, db.Count(t, db.Q(`{schema}.outbox_published`)), "nothing kept")
			}
			db.Exec(t, db.Q(`DELETE FROM {schema}.outbox`))
		})
	}
}

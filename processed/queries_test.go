package processed

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
)

// The claims' statements run with sequential scans off (byindex.go), which PostgreSQL
// costs at 10^10: a plan that still holds one costs past jit_above_cost (100,000 by
// default), and each claim was compiled, 0.4 s each (phase 30, when the current epoch's
// opened_at was first read with max()). Every plan must stay below it.
func TestClaimPlansStayBelowJITCost(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWithOptions(t, pgtest.Options{})
	s, err := New(&Config{Schema: db.Schema})
	require.NoError(t, err)
	ctx := context.Background()
	_, err = s.OpenEpoch(ctx, db.Pool, 0)
	require.NoError(t, err)
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // read only
	_, err = tx.Exec(ctx, `SELECT `+scansOff)
	require.NoError(t, err)
	ids, fps := []string{"a", "b"}, [][]byte{{1}, {2}}
	perRow := []any{[]string{"s", "s"}, ids, fps, []string{"done", "done"}, []int64{1e6, 1e6}, []int64{0, 0}, []*string{nil, nil}}
	for name, q := range map[string]struct {
		sql  string
		args []any
	}{
		"claimNew":       {s.sql.claimNew, append(perRow, []bool{true, false}, int32(1), time.Now())},
		"claimNewShared": {s.sql.claimNewShared, []any{"s", ids, fps, int64(1e6), []bool{true, false}, int32(1), time.Now()}},
		"claim":          {s.sql.claim, perRow},
		"lookup":         {s.sql.lookup, []any{[]string{"s", "s"}, ids, fps, []bool{true, false}, int32(1), time.Now()}},
	} {
		var plan []struct {
			Plan struct {
				TotalCost float64 `json:"Total Cost"`
			}
		}
		var raw []byte
		require.NoError(t, tx.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+q.sql, q.args...).Scan(&raw), name)
		require.NoError(t, json.Unmarshal(raw, &plan), name)
		require.Less(t, plan[0].Plan.TotalCost, 100000.0, "%s's plan costs past jit_above_cost: %s", name, raw)
	}
}

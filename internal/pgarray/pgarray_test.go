package pgarray_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgarray"
	"github.com/idemd/idemd/internal/pgtest"
)

// TestSameAsPlainSlices: PostgreSQL receives from Text and Bytes exactly what it receives
// from []string and [][]byte, NULLs included.
func TestSameAsPlainSlices(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	texts := []string{"a", "", "é\x01", "x y"}
	bytes := [][]byte{[]byte("k"), nil, {}, {0, 0xff}}
	const q = `SELECT $1::text[] IS NOT DISTINCT FROM $2::text[], $3::bytea[] IS NOT DISTINCT FROM $4::bytea[],
		coalesce(array_length($1::text[], 1), -1), $3::bytea[] IS NULL, ($3::bytea[])[2] IS NULL, ($3::bytea[])[3] = ''::bytea`
	for _, c := range []struct {
		t []string
		b [][]byte
	}{{texts, bytes}, {nil, nil}, {[]string{}, [][]byte{}}} {
		var sameText, sameBytes, bytesNull bool
		var n int
		var nullElem, emptyElem *bool
		require.NoError(t, db.Pool.QueryRow(ctx, q, pgarray.Text(c.t), c.t, pgarray.Bytes(c.b), c.b).
			Scan(&sameText, &sameBytes, &n, &bytesNull, &nullElem, &emptyElem))
		require.True(t, sameText, "%q", c.t)
		require.True(t, sameBytes, "%q", c.b)
		require.Equal(t, c.b == nil, bytesNull)
		if len(c.b) == 4 {
			require.True(t, *nullElem, "a nil element is NULL")
			require.True(t, *emptyElem, "an empty element is empty, not NULL")
		}
	}
}

// TestEveryExecMode: where pgx does not know the parameter's type (the simple protocol, a
// DATABASE_URL's default_query_exec_mode) the arrays still encode, as the plain slices.
func TestEveryExecMode(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	const q = `SELECT $1::text[] = $2::text[] AND $3::bytea[] IS NOT DISTINCT FROM $4::bytea[] AND $5::text[] IS NULL`
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		var same bool
		require.NoError(t, db.Pool.QueryRow(context.Background(), q, mode,
			pgarray.Text{"a", "b'c\\"}, []string{"a", "b'c\\"}, pgarray.Bytes{[]byte("x"), nil, {}}, [][]byte{[]byte("x"), nil, {}},
			pgarray.Text(nil)).Scan(&same), mode)
		require.True(t, same, mode)
	}
}

func TestNoAllocationPerElement(t *testing.T) {
	a := make(pgarray.Text, 100)
	b := make(pgarray.Bytes, 100)
	u := make(pgarray.UUID, 100)
	require.Zero(t, testing.AllocsPerRun(10, func() {
		for i := range a {
			_, _, _ = a.Index(i), b.Index(i), u.Index(i)
		}
	}))
}

// TestUUIDSameAsPlainSlice: UUID reaches PostgreSQL as []pgtype.UUID does, NULL elements and
// a NULL array included, in every exec mode.
func TestUUIDSameAsPlainSlice(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ids := []pgtype.UUID{{Bytes: [16]byte{1, 2, 3}, Valid: true}, {}, {Bytes: [16]byte{0xff, 15: 0xee}, Valid: true}}
	const q = `SELECT $1::uuid[] IS NOT DISTINCT FROM $2::uuid[], ($1::uuid[])[2] IS NULL, $3::uuid[] IS NULL, ($1::uuid[])[3]::text`
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		var same, nullElem, nullArray bool
		var third string
		require.NoError(t, db.Pool.QueryRow(context.Background(), q, mode, pgarray.UUID(ids), ids, pgarray.UUID(nil)).
			Scan(&same, &nullElem, &nullArray, &third), mode)
		require.True(t, same, mode)
		require.True(t, nullElem, mode)
		require.True(t, nullArray, mode)
		require.Equal(t, "ff000000-0000-0000-0000-0000000000ee", third, mode)
	}
}

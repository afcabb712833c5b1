package pgarray_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgarray"
	"github.com/idemd/idemd/internal/pgtest"
)

// binaryCases are values of this package beside the plain values that pgx encodes itself:
// after Register the bytes must be the same.
func binaryCases() []struct {
	name       string
	oid        uint32
	ours, pgxs any
} {
	texts := []string{"a", "", "é\x01", strings.Repeat("x", 300)}
	bytes := [][]byte{[]byte("k"), nil, {}, {0, 0xff}}
	ids := []pgtype.UUID{{Bytes: [16]byte{1, 2, 3}, Valid: true}, {}, {Bytes: [16]byte{0xff}, Valid: true}}
	ints := []int64{0, -1, 1 << 62, 42}
	docs := []string{`{}`, `{"a": [1, "é"]}`, `"s"`}
	return []struct {
		name       string
		oid        uint32
		ours, pgxs any
	}{
		{"text", pgtype.TextArrayOID, pgarray.Text(texts), texts},
		{"text empty", pgtype.TextArrayOID, pgarray.Text{}, []string{}},
		{"text nil", pgtype.TextArrayOID, pgarray.Text(nil), []string(nil)},
		{"varchar", pgtype.VarcharArrayOID, pgarray.Text(texts), texts},
		{"bytea", pgtype.ByteaArrayOID, pgarray.Bytes(bytes), bytes},
		{"bytea without null", pgtype.ByteaArrayOID, pgarray.Bytes(bytes[2:]), bytes[2:]},
		{"bytea nil", pgtype.ByteaArrayOID, pgarray.Bytes(nil), [][]byte(nil)},
		{"uuid", pgtype.UUIDArrayOID, pgarray.UUID(ids), ids},
		{"uuid without null", pgtype.UUIDArrayOID, pgarray.UUID(ids[:1]), ids[:1]},
		{"int8", pgtype.Int8ArrayOID, pgarray.Int8(ints), ints},
		{"int8 empty", pgtype.Int8ArrayOID, pgarray.Int8{}, []int64{}},
		{"jsonb", pgtype.JSONBArrayOID, pgarray.JSONB(docs), docs},
		{"json", pgtype.JSONArrayOID, pgarray.JSONB(docs), docs},
		{"jsonb nil", pgtype.JSONBArrayOID, pgarray.JSONB(nil), []string(nil)},
		{"any text", pgtype.TextArrayOID, []any{"a", nil, "", "b"}, []any{"a", nil, "", "b"}},
		{"any jsonb", pgtype.JSONBArrayOID, []any{`{"a":1}`, nil}, []any{`{"a":1}`, nil}},
		{"any varchar without null", pgtype.VarcharArrayOID, []any{"a", "b"}, []any{"a", "b"}},
		{"any json", pgtype.JSONArrayOID, []any{`[1]`}, []any{`[1]`}},
		{"any text, not strings", pgtype.TextArrayOID, []any{"a", []byte("b"), nil}, []any{"a", []byte("b"), nil}},
		{"any int8", pgtype.Int8ArrayOID, []any{int64(1), nil, int32(2)}, []any{int64(1), nil, int32(2)}},
		{"any nil", pgtype.TextArrayOID, []any(nil), []any(nil)},
	}
}

// TestRegisteredEncodesAsPgx: after Register, each array encodes to the bytes pgx's own codec
// writes for the plain value, in both formats, and without Register the arrays still
// encode to those bytes (through pgtype.ArrayGetter).
func TestRegisteredEncodesAsPgx(t *testing.T) {
	plain, fast := pgtype.NewMap(), pgtype.NewMap()
	require.False(t, pgarray.Registered(plain))
	pgarray.Register(fast)
	pgarray.Register(fast) // twice is once
	require.True(t, pgarray.Registered(fast))
	for _, c := range binaryCases() {
		for _, format := range []int16{pgtype.BinaryFormatCode, pgtype.TextFormatCode} {
			want, err := plain.Encode(c.oid, format, c.pgxs, nil)
			require.NoError(t, err, c.name)
			for _, m := range []*pgtype.Map{plain, fast} {
				got, err := m.Encode(c.oid, format, c.ours, []byte("prefix"))
				require.NoError(t, err, c.name)
				if want == nil {
					require.Nil(t, got, "%s: NULL", c.name)
					continue
				}
				require.Equal(t, append([]byte("prefix"), want...), got, "%s, format %d, registered %v", c.name, format, m == fast)
			}
		}
	}
}

// TestRegisteredPoolRoundTrip: through a pool whose connections are registered, PostgreSQL
// receives what it receives from the plain values, in every exec mode, and scanning arrays
// back still works.
func TestRegisteredPoolRoundTrip(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	cfg.AfterConnect = pgarray.AfterConnect
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	ctx := context.Background()
	for _, c := range binaryCases() {
		typ := map[uint32]string{pgtype.TextArrayOID: "text[]", pgtype.VarcharArrayOID: "varchar[]", pgtype.ByteaArrayOID: "bytea[]",
			pgtype.UUIDArrayOID: "uuid[]", pgtype.Int8ArrayOID: "int8[]", pgtype.JSONBArrayOID: "jsonb[]", pgtype.JSONArrayOID: "json[]"}[c.oid]
		q := `SELECT $1::` + typ + `::text IS NOT DISTINCT FROM $2::` + typ + `::text, $1::` + typ + `::text`
		for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
			pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
			if _, ok := c.pgxs.([]any); ok && (mode == pgx.QueryExecModeExec || mode == pgx.QueryExecModeSimpleProtocol) {
				continue // pgx encodes a []any only where it knows the parameter's type
			}
			var same bool
			var text *string
			require.NoError(t, pool.QueryRow(ctx, q, mode, c.ours, c.pgxs).Scan(&same, &text), "%s %v", c.name, mode)
			require.True(t, same, "%s %v: %v", c.name, mode, text)
		}
	}
	var back []string
	require.NoError(t, pool.QueryRow(ctx, `SELECT $1::text[]`, pgarray.Text{"x", "y"}).Scan(&back))
	require.Equal(t, []string{"x", "y"}, back)
	var ints []int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT $1::int8[]`, pgarray.Int8{3, 4}).Scan(&ints))
	require.Equal(t, []int64{3, 4}, ints)
}

// TestRegisteredGrowsOnce: encoding a registered array into a buffer too small for it grows
// the buffer once.
func TestRegisteredGrowsOnce(t *testing.T) {
	if raceDetector {
		t.Skip("the race detector allocates: allocations are counted without it")
	}
	m := pgtype.NewMap()
	pgarray.Register(m)
	a := make(pgarray.Bytes, 500)
	for i := range a {
		a[i] = make([]byte, 200)
	}
	var v any = a
	buf := make([]byte, 0, 256)
	require.Equal(t, 1.0, testing.AllocsPerRun(20, func() {
		if _, err := m.Encode(pgtype.ByteaArrayOID, pgtype.BinaryFormatCode, v, buf[:0]); err != nil {
			t.Fatal(err)
		}
	}))
}

// TestRegisteredStringsGrowOnce: a []any of strings and nils (a multi-message effect's
// column) takes the same one growth.
func TestRegisteredStringsGrowOnce(t *testing.T) {
	if raceDetector {
		t.Skip("the race detector allocates: allocations are counted without it")
	}
	m := pgtype.NewMap()
	pgarray.Register(m)
	col := make([]any, 500)
	for i := range col {
		if i%7 != 0 {
			col[i] = strings.Repeat("x", 200)
		}
	}
	var v any = col
	buf := make([]byte, 0, 256)
	for _, oid := range []uint32{pgtype.TextArrayOID, pgtype.JSONBArrayOID} {
		require.Equal(t, 1.0, testing.AllocsPerRun(20, func() {
			if _, err := m.Encode(oid, pgtype.BinaryFormatCode, v, buf[:0]); err != nil {
				t.Fatal(err)
			}
		}), oid)
	}
}

// BenchmarkEncode: a batch's column of 500 texts, 200-byte payloads and jsonb headers,
// encoded as pgx's executor does it (into a 256-byte buffer), by pgx's codec and after
// Register.
func BenchmarkEncode(b *testing.B) {
	texts := make(pgarray.Text, 500)
	payloads := make(pgarray.Bytes, 500)
	headers := make(pgarray.JSONB, 500)
	for i := range texts {
		texts[i] = "evt_" + strings.Repeat("0", 28)
		payloads[i] = make([]byte, 200)
		headers[i] = `{"content-type":"application/json"}`
	}
	for _, registered := range []bool{false, true} {
		m := pgtype.NewMap()
		name := "pgx"
		if registered {
			pgarray.Register(m)
			name = "registered"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				buf := make([]byte, 0, 256)
				var err error
				for _, c := range []struct {
					oid uint32
					v   any
				}{{pgtype.TextArrayOID, texts}, {pgtype.ByteaArrayOID, payloads}, {pgtype.JSONBArrayOID, headers}} {
					if buf, err = m.Encode(c.oid, pgtype.BinaryFormatCode, c.v, buf); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

package pgarray_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgarray"
	"github.com/idemd/idemd/internal/pgtest"
)

// connect opens a connection to the test server, registered (Register) or not, in pgx's
// default exec mode or in mode.
func connect(t *testing.T, registered bool, mode ...pgx.QueryExecMode) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	for _, m := range mode {
		cfg.DefaultQueryExecMode = m
	}
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if registered {
		pgarray.Register(conn.TypeMap())
	}
	return conn
}

// reserveBatch is a batch shaped as the unit's: statements of several large arrays, one of
// them passed for another element type than its own (JSONB for text[]: pgx's codec encodes
// it), a NULL array, a multi-message effect's []any column (unless untyped: pgx encodes a
// []any only where it knows the parameter's type) and scalars. Each statement returns the
// MD5 of the text form of what it received.
func reserveBatch(n int, got *[]string, untyped ...bool) *pgx.Batch {
	ids, payloads, docs, col := make(pgarray.Text, n), make(pgarray.Bytes, n), make(pgarray.JSONB, n), make([]any, n)
	for i := range n {
		ids[i] = fmt.Sprintf("evt_%028d", i)
		payloads[i] = []byte(strings.Repeat("p", 150+i%100))
		docs[i] = fmt.Sprintf(`{"i": %d, "s": "%s"}`, i, strings.Repeat("d", 40))
		if i%5 != 0 {
			col[i] = ids[i]
		}
	}
	var column any = col
	if len(untyped) > 0 && untyped[0] {
		column = pgarray.Text(ids)
	}
	b := &pgx.Batch{}
	scan := func(row pgx.Row) error {
		var s string
		if err := row.Scan(&s); err != nil {
			return err
		}
		*got = append(*got, s)
		return nil
	}
	b.Queue(`SELECT md5(concat_ws('|', $1::text[], $2::bytea[], $3::int8))`, ids, payloads, int64(n)).QueryRow(scan)
	b.Queue(`SELECT md5(concat_ws('|', $1::text, $2::jsonb[], $3::text[], $4::text[], $5::text[]))`, "scope", docs, pgarray.JSONB(ids), column, pgarray.Text(nil)).QueryRow(scan)
	b.Queue(`SELECT $1::text`, "no array").QueryRow(scan)
	return b
}

// reserveBatchMixed is reserveBatch with two more statements: []any columns first, as a
// multi-message effect's, for types Register wraps and types it does not (int4[],
// timestamptz[]); and arrays given to parameters of a scalar type whose codec takes any Go
// value (jsonb, which marshals them).
func reserveBatchMixed(n int, got *[]string) *pgx.Batch {
	b := reserveBatch(n, got)
	scan := b.QueuedQueries[0].Fn
	ids, col := make(pgarray.Text, n), make([]any, n)
	ints, times, nums := make([]any, n), make([]any, n), make([]any, n)
	for i := range n {
		ids[i] = fmt.Sprintf("evt_%028d", i)
		if i%5 != 0 {
			col[i] = ids[i]
		}
		ints[i], nums[i] = int32(i), int64(i)*1_000_003
		times[i] = time.Date(2026, 12, 5, 0, 0, i%60, 0, time.UTC)
	}
	q := b.Queue(`SELECT md5(concat_ws('|', $1::text[], $2::int4[], $3::timestamptz[], $4::int8[]))`, col, ints, times, nums)
	q.Fn = scan
	q = b.Queue(`SELECT md5(concat_ws('|', $1::jsonb, $2::jsonb, $3::text))`, ids, col, "scope")
	q.Fn = scan
	return b
}

// TestReserveChangesNoByte: a batch sent after Reserve, and sent again after a second
// Reserve, gives PostgreSQL what the same batch gives it without Reserve.
func TestReserveChangesNoByte(t *testing.T) {
	conn := connect(t, true)
	ctx := context.Background()
	var want []string
	require.NoError(t, conn.SendBatch(ctx, reserveBatchMixed(500, &want)).Close())
	require.Len(t, want, 5)

	var got []string
	b := reserveBatchMixed(500, &got)
	for range 2 {
		got = got[:0]
		pgarray.Reserve(conn, b)
		require.NoError(t, conn.SendBatch(ctx, b).Close())
		require.Equal(t, want, got)
	}
	// In a transaction, as the unit sends its batches.
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	got = got[:0]
	b = reserveBatchMixed(500, &got)
	pgarray.Reserve(tx.Conn(), b)
	require.NoError(t, tx.SendBatch(ctx, b).Close())
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, want, got)

	// A batch whose reservation is above 1 KiB and whose messages are below it: pgx keeps
	// the connection's write buffer as its own after the flush, and the statements that
	// follow, in a batch or not, write into it.
	scalars := make([]any, 60)
	for i := range scalars {
		scalars[i] = int64(i)
	}
	var sum int64
	small := &pgx.Batch{}
	small.Queue(`SELECT 0`+placeholders(1, 60), scalars...).QueryRow(func(row pgx.Row) error { return row.Scan(&sum) })
	pgarray.Reserve(conn, small)
	require.NoError(t, conn.SendBatch(ctx, small).Close())
	require.EqualValues(t, 59*60/2, sum)
	var echo string
	require.NoError(t, conn.QueryRow(ctx, `SELECT $1::text`, strings.Repeat("e", 3000)).Scan(&echo))
	require.Equal(t, strings.Repeat("e", 3000), echo)

	// A smaller batch of other values, then a larger one, in the bytes the connection's
	// earlier statements were encoded into.
	for _, n := range []int{300, 700} {
		var want, got []string
		require.NoError(t, connect(t, true).SendBatch(ctx, reserveBatchMixed(n, &want)).Close())
		b := reserveBatchMixed(n, &got)
		pgarray.Reserve(conn, b)
		require.NoError(t, conn.SendBatch(ctx, b).Close())
		require.Equal(t, want, got, "%d messages", n)
	}
}

// placeholders is " + $from::int8 + … + $to::int8".
func placeholders(from, to int) string {
	var b strings.Builder
	for i := from; i <= to; i++ {
		fmt.Fprintf(&b, " + $%d::int8", i)
	}
	return b.String()
}

// TestReserveLeavesArgumentsWherePgxTypesThem: without Register pgx encodes the arrays
// itself, and in QueryExecModeExec and the simple protocol it takes their types from their
// Go values: Reserve leaves those batches' arguments as they are, and they still send.
func TestReserveLeavesArgumentsWherePgxTypesThem(t *testing.T) {
	ctx := context.Background()
	unchanged := func(t *testing.T, conn *pgx.Conn, b *pgx.Batch, got *[]string) {
		t.Helper()
		types := func() (ts []string) {
			for _, q := range b.QueuedQueries {
				for _, a := range q.Arguments {
					ts = append(ts, fmt.Sprintf("%T", a))
				}
			}
			return ts
		}
		before := types()
		pgarray.Reserve(conn, b)
		require.Equal(t, before, types())
		require.NoError(t, conn.SendBatch(ctx, b).Close())
		require.Len(t, *got, 3)
	}
	var got []string
	unchanged(t, connect(t, false), reserveBatch(500, &got), &got)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		got = nil
		unchanged(t, connect(t, true, mode), reserveBatch(500, &got, true), &got)
	}
}

// TestReserveLeavesTheCallersArguments: the arguments a statement was queued with, a slice
// the caller may use again, keep their values; a NULL first array passes the reservation
// on to the next.
func TestReserveLeavesTheCallersArguments(t *testing.T) {
	conn := connect(t, true)
	payloads := make(pgarray.Bytes, 500)
	for i := range payloads {
		payloads[i] = []byte(strings.Repeat("p", 200))
	}
	args := []any{pgarray.Text(nil), payloads}
	var n int
	b := &pgx.Batch{}
	b.Queue(`SELECT coalesce(cardinality($1::text[]), 0) + cardinality($2::bytea[])`, args...).QueryRow(func(row pgx.Row) error { return row.Scan(&n) })
	pgarray.Reserve(conn, b)
	require.Equal(t, []any{pgarray.Text(nil), payloads}, args)
	require.NotEqual(t, fmt.Sprintf("%T", payloads), fmt.Sprintf("%T", b.QueuedQueries[0].Arguments[1]), "the payloads reserve")
	require.NoError(t, conn.SendBatch(context.Background(), b).Close())
	require.Equal(t, 500, n)
}

// TestReserveAllocatesLess: the arrays are encoded into the connection's own parameter
// buffer and the batch's messages into its own write buffer, both kept from batch to
// batch: sending the batch allocates less than a tenth of the bytes it allocates without
// Reserve (a twentieth, measured when written; half when each buffer was grown once a
// statement or a batch instead, phase 35), where every statement's arrays and then the
// batch's messages were built up by doubling.
func TestReserveAllocatesLess(t *testing.T) {
	if raceDetector {
		t.Skip("the race detector allocates: allocations are counted without it")
	}
	conn := connect(t, true)
	ctx := context.Background()
	send := func(reserve bool) uint64 {
		const rounds = 10
		var got []string
		batches := make([]*pgx.Batch, rounds)
		for i := range batches {
			batches[i] = reserveBatch(500, &got)
		}
		require.NoError(t, conn.SendBatch(ctx, reserveBatch(500, &got)).Close()) // statements prepared
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for _, b := range batches {
			if reserve {
				pgarray.Reserve(conn, b)
			}
			if err := conn.SendBatch(ctx, b).Close(); err != nil {
				t.Fatal(err)
			}
		}
		runtime.ReadMemStats(&after)
		return (after.TotalAlloc - before.TotalAlloc) / rounds
	}
	without, with := send(false), send(true)
	t.Logf("bytes allocated per batch: %d without Reserve, %d with it", without, with)
	require.Less(t, with*10, without)
}

package pgarray_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"

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

// TestReserveChangesNoByte: a batch sent after Reserve, and sent again after a second
// Reserve, gives PostgreSQL what the same batch gives it without Reserve.
func TestReserveChangesNoByte(t *testing.T) {
	conn := connect(t, true)
	ctx := context.Background()
	var want []string
	require.NoError(t, conn.SendBatch(ctx, reserveBatch(500, &want)).Close())
	require.Len(t, want, 3)

	var got []string
	b := reserveBatch(500, &got)
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
	b = reserveBatch(500, &got)
	pgarray.Reserve(tx.Conn(), b)
	require.NoError(t, tx.SendBatch(ctx, b).Close())
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, want, got)
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

// TestReserveAllocatesLess: pgx's buffers are grown once a statement and once a batch:
// sending the batch allocates at most two thirds of the bytes it allocates without Reserve
// (about half, measured when written), where every statement's arrays and then the batch's
// messages were built up by doubling.
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
	require.Less(t, with*3, without*2)
}

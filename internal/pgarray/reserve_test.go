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

// connect opens a connection to the test server, registered (Register) or not.
func connect(t *testing.T, registered bool) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), pgtest.URL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if registered {
		pgarray.Register(conn.TypeMap())
	}
	return conn
}

// reserveBatch is a batch shaped as the unit's: statements of several large arrays, one of
// them passed for another element type than its own (JSONB for text[]: pgx's codec encodes
// it), a NULL array, a multi-message effect's []any column and scalars. Each statement
// returns the MD5 of the text form of what it received.
func reserveBatch(n int, got *[]string) *pgx.Batch {
	ids, payloads, docs, col := make(pgarray.Text, n), make(pgarray.Bytes, n), make(pgarray.JSONB, n), make([]any, n)
	for i := range n {
		ids[i] = fmt.Sprintf("evt_%028d", i)
		payloads[i] = []byte(strings.Repeat("p", 150+i%100))
		docs[i] = fmt.Sprintf(`{"i": %d, "s": "%s"}`, i, strings.Repeat("d", 40))
		if i%5 != 0 {
			col[i] = ids[i]
		}
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
	b.Queue(`SELECT md5(concat_ws('|', $1::text, $2::jsonb[], $3::text[], $4::text[], $5::text[]))`, "scope", docs, pgarray.JSONB(ids), col, pgarray.Text(nil)).QueryRow(scan)
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

// TestReserveLeavesUnregisteredConnections: without Register, pgx encodes the arrays
// itself, and Reserve leaves the batch as it is.
func TestReserveLeavesUnregisteredConnections(t *testing.T) {
	conn := connect(t, false)
	var got []string
	b := reserveBatch(10, &got)
	before := fmt.Sprintf("%#v", b.QueuedQueries[0].Arguments)
	pgarray.Reserve(conn, b)
	require.Equal(t, before, fmt.Sprintf("%#v", b.QueuedQueries[0].Arguments))
	require.NoError(t, conn.SendBatch(context.Background(), b).Close())
	require.Len(t, got, 3)
}

// TestReserveAllocatesLess: pgx's buffers are grown once a statement and once a batch:
// sending the batch allocates at most two thirds of the bytes it allocates without Reserve
// (about half, measured when written), where every statement's arrays and then the batch's
// messages were built up by doubling.
func TestReserveAllocatesLess(t *testing.T) {
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

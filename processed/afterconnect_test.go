package processed_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgarray"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/processed"
)

// TestAfterConnect: a connection given processed.AfterConnect encodes the arrays itself,
// and claims a batch through it.
func TestAfterConnect(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(ctx) })
	require.False(t, pgarray.Registered(conn.TypeMap()))
	require.NoError(t, processed.AfterConnect(ctx, conn))
	require.True(t, pgarray.Registered(conn.TypeMap()))
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	fp := processed.Fingerprint([]byte(`{"a":1}`))
	store, err := processed.New(&processed.Config{Schema: db.Schema})
	require.NoError(t, err)
	res, err := store.ClaimBatchTx(ctx, tx, []processed.Claim{{Scope: "s", MessageID: "a", Fingerprint: fp}, {Scope: "s", MessageID: "b", Fingerprint: fp}})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Len(t, res, 2)
	require.Equal(t, processed.Claimed, res[0].Outcome)
	require.Equal(t, processed.Claimed, res[1].Outcome)
}

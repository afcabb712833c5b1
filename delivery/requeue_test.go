package delivery_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/delivery"
	"github.com/idemd/idemd/internal/pgtest"
)

// TestRequeueTx: a dead delivery is made pending again with the caller's transaction, and
// only if it commits; a pending one is refused.
func TestRequeueTx(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWithOptions(t, pgtest.Options{MaxConns: 2})
	ctx := context.Background()
	insert := func(state string) int64 {
		var id int64
		require.NoError(t, db.Pool.QueryRow(ctx, db.Q(`INSERT INTO {schema}.http_deliveries
    (endpoint, operation_id, pipeline, causation_id, payload, state, attempts, finished_at)
VALUES ('partner', $1, 'p', 'm', '{}', $2, 5, CASE WHEN $2 <> 'pending' THEN now() END) RETURNING id`),
			uuid.New(), state).Scan(&id))
		return id
	}
	dead, pending := insert("dead"), insert("pending")
	store := delivery.NewStore(db.Schema)

	// Rolled back: nothing changes.
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, store.RequeueTx(ctx, tx, dead))
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, 1, db.Count(t, "{schema}.http_deliveries WHERE id = $1 AND state = 'dead'", dead))

	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return store.RequeueTx(ctx, tx, dead) }))
	require.Equal(t, 1, db.Count(t, "{schema}.http_deliveries WHERE id = $1 AND state = 'pending' AND attempts = 0 AND finished_at IS NULL", dead))

	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return store.RequeueTx(ctx, tx, pending) })
	require.ErrorIs(t, err, delivery.ErrPending)
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return store.RequeueTx(ctx, tx, 1<<40) })
	require.ErrorIs(t, err, delivery.ErrNotFound)
}

package outbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/outbox"
)

func TestOperationIDIsDeterministic(t *testing.T) {
	t.Parallel()
	a := outbox.OperationID("stripe", "evt_1", 0)
	require.Equal(t, a, outbox.OperationID("stripe", "evt_1", 0))
	require.Equal(t, uuid.Version(5), a.Version())
	require.NotEqual(t, a, outbox.OperationID("stripe", "evt_1", 1))
	require.NotEqual(t, a, outbox.OperationID("github", "evt_1", 0))
	require.NotEqual(t, outbox.OperationID("a", "b\x1fc", 0), outbox.OperationID("a\x1fb", "c", 0))
}

func TestEnqueueCommitsWithTheTransaction(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	store := outbox.New(&outbox.Config{Schema: db.Schema})
	ctx := context.Background()
	events := []outbox.Event{
		{Topic: "t", Key: []byte("k"), Payload: []byte("one"), Pipeline: "p", CausationID: "m1", Headers: map[string]string{"event-type": "x"}},
		{Topic: "t", Payload: []byte("two"), Pipeline: "p", CausationID: "m1"},
	}

	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, store.EnqueueTx(ctx, tx, events...))
	require.NoError(t, tx.Rollback(ctx))
	require.Zero(t, db.Count(t, "{schema}.outbox"))

	tx, err = db.Pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, store.EnqueueTx(ctx, tx, events...))
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, 1, db.Count(t, "{schema}.outbox WHERE operation_id = $1", outbox.OperationID("p", "m1", 0)))
	require.Equal(t, 1, db.Count(t, "{schema}.outbox WHERE operation_id = $1", outbox.OperationID("p", "m1", 1)))

	tx, err = db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	err = store.EnqueueTx(ctx, tx, outbox.Event{Payload: []byte("x"), Pipeline: "p", CausationID: "m"})
	require.Error(t, err)
	require.Contains(t, err.Error(), "topic is required")
	require.False(t, errors.Is(err, context.Canceled))
}

package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
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

// The outbox insert sends each distinct headers value once; every row must still get its
// own event's headers. Runs of one value, a value coming back after others, an empty map
// and more distinct values than one, which the map of seen values serves.
func TestEnqueueStoresEachEventsHeaders(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	store := outbox.New(&outbox.Config{Schema: db.Schema})
	ctx := context.Background()
	shared := map[string]string{"content-type": "application/json"}
	var events []outbox.Event
	want := map[string]map[string]string{}
	for i := range 40 {
		h := shared
		switch {
		case i%7 == 3:
			h = map[string]string{"event-type": fmt.Sprintf("t%d", i%21)} // 3 values, each twice and more
		case i%5 == 4:
			h = map[string]string{"n": fmt.Sprint(i)} // distinct
		case i == 10:
			h = nil
		}
		id := fmt.Sprintf("m%02d", i)
		events = append(events, outbox.Event{Topic: "t", Payload: []byte(id), Pipeline: "p", CausationID: id, Headers: h})
		want[id] = h
		if h == nil {
			want[id] = map[string]string{}
		}
	}
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // a failed test's transaction must not hold the schema's drop
	require.NoError(t, store.EnqueueTx(ctx, tx, events...))
	require.NoError(t, tx.Commit(ctx))

	rows, err := db.Pool.Query(ctx, db.Q("SELECT causation_id, headers FROM {schema}.outbox ORDER BY id"))
	require.NoError(t, err)
	defer rows.Close()
	var order []string
	for rows.Next() {
		var id string
		var h map[string]string
		require.NoError(t, rows.Scan(&id, &h))
		require.Equal(t, want[id], h, id)
		order = append(order, id)
	}
	require.NoError(t, rows.Err())
	require.Len(t, order, 40)
	require.True(t, slices.IsSorted(order), "ids drawn in the events' order: %v", order)
}

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

// An insert whose rows share their pipeline, destination (an outbox row's topic, a
// delivery's endpoint) and headers sends them once; one whose rows differ in any of them
// sends them per row. Either way each row, in the outbox and in http_deliveries, holds its
// own event, in the events' order.
func TestEnqueueSharedOrMixedColumns(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	store := outbox.New(&outbox.Config{Schema: db.Schema})
	ctx := context.Background()
	json := map[string]string{"content-type": "application/json"}
	event := func(batch, i int, pipeline, topic, endpoint string, h map[string]string) outbox.Event {
		id := fmt.Sprintf("b%d-m%d", batch, i)
		e := outbox.Event{Topic: topic, Endpoint: endpoint, Payload: []byte("payload " + id), Pipeline: pipeline, CausationID: id, Headers: h}
		if i%2 == 1 {
			e.Key = []byte("key " + id)
		}
		return e
	}
	batches := [][]outbox.Event{
		{event(0, 0, "p", "t", "e", json), event(0, 1, "p", "t", "e", json), event(0, 2, "p", "t", "e", json)}, // shared
		{event(1, 0, "p", "t", "e", json), event(1, 1, "p", "u", "e", json), event(1, 2, "p", "t", "e", json)}, // topics differ
		{event(2, 0, "p", "t", "e", json), event(2, 1, "p", "t", "f", json), event(2, 2, "p", "t", "e", json)}, // endpoints differ
		{event(3, 0, "p", "t", "e", json), event(3, 1, "q", "t", "e", json), event(3, 2, "p", "t", "e", json)}, // pipelines differ
		{event(4, 0, "p", "t", "e", json), event(4, 1, "p", "t", "e", nil), event(4, 2, "p", "t", "e", json)},  // headers differ
		{event(5, 0, "p", "t", "e", nil)}, // one event, no headers
	}
	var want []outbox.Event
	for _, events := range batches {
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, store.EnqueueTx(ctx, tx, events...))
		require.NoError(t, tx.Commit(ctx))
		for i, e := range events {
			e.OperationID = outbox.OperationID(e.Pipeline, e.CausationID, i)
			if e.Headers == nil {
				e.Headers = map[string]string{}
			}
			want = append(want, e)
		}
	}
	read := func(table, dest string) []outbox.Event {
		rows, err := db.Pool.Query(ctx, db.Q("SELECT operation_id, pipeline, causation_id, "+dest+", key, payload, headers FROM {schema}."+table+" ORDER BY id"))
		require.NoError(t, err)
		defer rows.Close()
		var got []outbox.Event
		for rows.Next() {
			e := outbox.Event{Topic: "t", Endpoint: "e"}
			d := &e.Topic
			if dest == "endpoint" {
				d = &e.Endpoint
			}
			require.NoError(t, rows.Scan(&e.OperationID, &e.Pipeline, &e.CausationID, d, &e.Key, &e.Payload, &e.Headers))
			got = append(got, e)
		}
		require.NoError(t, rows.Err())
		return got
	}
	// Each table holds its own destination; the other one is the events' usual value.
	outboxWant, deliveriesWant := slices.Clone(want), slices.Clone(want)
	for i := range want {
		outboxWant[i].Endpoint, deliveriesWant[i].Topic = "e", "t"
	}
	require.Equal(t, outboxWant, read("outbox", "topic"))
	require.Equal(t, deliveriesWant, read("http_deliveries", "endpoint"))
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

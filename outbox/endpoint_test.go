package outbox_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/outbox"
)

// TestEnqueueWithEndpoint: an event with an HTTP endpoint also gets an http_deliveries row
// with the same operation id; an HTTP-only event never reaches the Kafka outbox.
func TestEnqueueWithEndpoint(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	store := outbox.New(&outbox.Config{Schema: db.Schema})
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, store.EnqueueTx(ctx, tx,
		outbox.Event{Topic: "t", Endpoint: "partner", Key: []byte("k"), Payload: []byte("both"), Pipeline: "p", CausationID: "m"},
		outbox.Event{Endpoint: "partner", Payload: []byte("http"), Pipeline: "p", CausationID: "m"},
		outbox.Event{Topic: "t", Payload: []byte("kafka"), Pipeline: "p", CausationID: "m"},
	))
	require.NoError(t, tx.Commit(ctx))

	require.Equal(t, 2, db.Count(t, "{schema}.outbox"))
	require.Equal(t, 1, db.Count(t, "{schema}.outbox WHERE operation_id = $1 AND payload = 'both'", outbox.OperationID("p", "m", 0)))
	require.Equal(t, 1, db.Count(t, "{schema}.outbox WHERE operation_id = $1 AND payload = 'kafka'", outbox.OperationID("p", "m", 2)))
	require.Equal(t, 2, db.Count(t, "{schema}.http_deliveries WHERE endpoint = 'partner' AND state = 'pending'"))
	require.Equal(t, 1, db.Count(t, "{schema}.http_deliveries WHERE operation_id = $1 AND key = 'k'", outbox.OperationID("p", "m", 0)))
	require.Equal(t, 1, db.Count(t, "{schema}.http_deliveries WHERE operation_id = $1 AND key IS NULL", outbox.OperationID("p", "m", 1)))

	tx, err = db.Pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, store.EnqueueTx(ctx, tx, outbox.Event{Endpoint: "partner", Payload: []byte("x"), Pipeline: "p", CausationID: "r"}))
	require.NoError(t, tx.Rollback(ctx))
	require.Zero(t, db.Count(t, "{schema}.http_deliveries WHERE causation_id = 'r'"), "rows commit with the transaction only")
}

// TestEnqueueMakesDeliveryHeadersSendable: a header that arrived with a CR, LF or another
// control character (a Kafka header, a JSON /type) is made a valid HTTP field value in the
// http_deliveries row, and a name that is not an HTTP token is dropped; otherwise every
// delivery attempt would fail before sending. The Kafka outbox row keeps the headers as
// they came.
func TestEnqueueMakesDeliveryHeadersSendable(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	store := outbox.New(&outbox.Config{Schema: db.Schema})
	ctx := context.Background()
	raw := map[string]string{
		outbox.HeaderEventType:   "order.paid\r\nX-Injected: 1",
		outbox.HeaderContentType: "application/json\n",
		"bad name\r\n":           "x",
	}
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, store.EnqueueTx(ctx, tx, outbox.Event{Topic: "t", Endpoint: "partner", Payload: []byte("{}"),
		Pipeline: "p", CausationID: "m", Headers: raw}))
	require.NoError(t, tx.Commit(ctx))

	var delivered, kafka map[string]string
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT headers FROM "+db.Schema+".http_deliveries").Scan(&delivered))
	require.Equal(t, map[string]string{outbox.HeaderEventType: "order.paid  X-Injected: 1", outbox.HeaderContentType: "application/json"}, delivered)
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT headers FROM "+db.Schema+".outbox").Scan(&kafka))
	require.Equal(t, raw, kafka)
}

package deadletter_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/internal/pgtest"
)

func TestWriteListReplay(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	s := deadletter.New(db.Schema)
	ctx := context.Background()

	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	id, err := s.WriteTx(ctx, tx, &deadletter.Letter{
		Pipeline: "stripe", Origin: deadletter.Origin{Door: deadletter.DoorHTTP}, Scope: "stripe", MessageID: "evt_1", Payload: []byte(`{"id":"evt_1"}`),
		Headers: map[string][]string{"Content-Type": {"application/json"}}, Metadata: map[string]any{"extra": "kept"},
		Request: &deadletter.Request{Method: "POST", Path: "/webhooks/stripe", Tenant: "acme\x00"},
		Reason:  "23505: duplicate key", Attempts: 1,
	})
	require.NoError(t, err)
	_, err = s.WriteTx(ctx, tx, &deadletter.Letter{Pipeline: "ledger", Origin: deadletter.Origin{Door: deadletter.DoorKafka}, Scope: "ledger", Reason: "no message id", Attempts: 1})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	all, err := s.List(ctx, db.Pool, deadletter.Filter{})
	require.NoError(t, err)
	require.Len(t, all, 2)
	stripe, err := s.List(ctx, db.Pool, deadletter.Filter{Pipeline: "stripe"})
	require.NoError(t, err)
	require.Len(t, stripe, 1)
	require.Equal(t, "evt_1", stripe[0].MessageID)
	require.Equal(t, []string{"application/json"}, stripe[0].Headers["Content-Type"])
	require.Equal(t, map[string]any{"extra": "kept", "method": "POST", "path": "/webhooks/stripe", "tenant": "acme\uFFFD"}, stripe[0].Metadata,
		"the request's entries are written as metadata, cleaned like the others")
	require.Nil(t, stripe[0].Request)

	tx, err = db.Pool.Begin(ctx)
	require.NoError(t, err)
	l, err := s.GetTx(ctx, tx, id)
	require.NoError(t, err)
	require.Equal(t, `{"id":"evt_1"}`, string(l.Payload))
	require.NoError(t, s.MarkReplayedTx(ctx, tx, id))
	_, err = s.GetTx(ctx, tx, 999999)
	require.ErrorIs(t, err, deadletter.ErrNotFound)
	require.NoError(t, tx.Rollback(ctx))
}

func TestReplayOnce(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	s := deadletter.New(db.Schema)
	ctx := context.Background()
	var id int64
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		var err error
		id, err = s.WriteTx(ctx, tx, &deadletter.Letter{Pipeline: "p", Origin: deadletter.Origin{Door: deadletter.DoorKafka}, Scope: "p", MessageID: "m", Reason: "boom", Attempts: 1})
		return err
	}))
	runs := 0
	boom := errors.New("still broken")
	require.ErrorIs(t, s.Replay(ctx, db.Pool, id, func(context.Context, pgx.Tx, *deadletter.Letter) error { runs++; return boom }), boom)
	require.Equal(t, 0, db.Count(t, "{schema}.dead_letters WHERE replayed_at IS NOT NULL"), "a failed replay leaves the letter as it was")
	require.NoError(t, s.Replay(ctx, db.Pool, id, func(context.Context, pgx.Tx, *deadletter.Letter) error { runs++; return nil }))
	require.ErrorIs(t, s.Replay(ctx, db.Pool, id, func(context.Context, pgx.Tx, *deadletter.Letter) error { runs++; return nil }), deadletter.ErrAlreadyReplayed)
	require.Equal(t, 2, runs, "not run again once replayed")
}

// TestReplayerRoutesByOrigin: a letter goes to the function its door (and pipeline)
// registered, once; a letter no door registered is refused and left as it was.
func TestReplayerRoutesByOrigin(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	s := deadletter.New(db.Schema)
	ctx := context.Background()
	write := func(door deadletter.Door, pipeline string) int64 {
		var id int64
		require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			var err error
			id, err = s.WriteTx(ctx, tx, &deadletter.Letter{Pipeline: pipeline, Origin: deadletter.Origin{Door: door}, Scope: pipeline, Reason: "x"})
			return err
		}))
		return id
	}
	generic, specific, orphan := write(deadletter.DoorKafka, "a"), write(deadletter.DoorKafka, "b"), write(deadletter.DoorRelay, "a")
	rp := deadletter.NewReplayer(db.Pool, s)
	fn := func(name string) deadletter.ReplayFunc {
		return func(context.Context, pgx.Tx, *deadletter.Letter) (deadletter.Replayed, error) {
			return deadletter.Replayed{Outcome: deadletter.ReplayApplied, Done: name}, nil
		}
	}
	rp.Register(deadletter.DoorKafka, "", fn("any kafka pipeline"))
	rp.Register(deadletter.DoorKafka, "b", fn("pipeline b"))

	what, err := rp.Replay(ctx, generic)
	require.NoError(t, err)
	require.Equal(t, "any kafka pipeline", what.Done)
	what, err = rp.Replay(ctx, specific)
	require.NoError(t, err)
	require.Equal(t, "pipeline b", what.Done)
	_, err = rp.Replay(ctx, specific)
	require.ErrorIs(t, err, deadletter.ErrAlreadyReplayed)
	_, err = rp.Replay(ctx, orphan)
	require.ErrorIs(t, err, deadletter.ErrNoReplayer)
	require.Equal(t, 1, db.Count(t, "{schema}.dead_letters WHERE replayed_at IS NULL AND door = 'relay'"))

	var noDoor error
	require.Error(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, noDoor = s.WriteTx(ctx, tx, &deadletter.Letter{Pipeline: "a", Scope: "a", Reason: "x"})
		return noDoor
	}))
	require.ErrorContains(t, noDoor, "Origin.Door is required")
}

// TestRecord: a letter's Record is written into its Metadata and Headers (beside the entries
// given there, which it leaves unchanged, and cleaned like them), and RecordOf reads it back.
func TestRecord(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	s := deadletter.New(db.Schema)
	ctx := context.Background()
	at := time.Date(2026, 12, 1, 17, 0, 0, 5, time.FixedZone("CET", 3600))
	kafkaRec := &deadletter.Record{
		Topic: "payments", Partition: 2, Offset: 1 << 40, Key: []byte("cus_1"), Time: at, DedupID: "kafka-position:payments/2/1099511627776",
		Headers: []deadletter.Header{{Key: "x-tag", Value: []byte("a")}, {Key: "x-tag", Value: []byte("b\x00")}, {Key: "e", Value: []byte{}}},
	}
	given := map[string]any{"extra": "kept"}
	sqsRec := &deadletter.Record{
		Subscription: "orders", BrokerMessageID: "b5f7", Ordered: true, DeliveryAttempt: 2, Time: at,
		Attributes: map[string]string{"message-id": "evt_2"},
	}
	var ids [2]int64
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		var err error
		ids[0], err = s.WriteTx(ctx, tx, &deadletter.Letter{Pipeline: "p", Origin: deadletter.Origin{Door: deadletter.DoorKafka}, Scope: "p",
			Metadata: given, Headers: map[string][]string{"given": {"1"}}, Record: kafkaRec, Reason: "x"})
		if err != nil {
			return err
		}
		ids[1], err = s.WriteTx(ctx, tx, &deadletter.Letter{Pipeline: "p", Origin: deadletter.Origin{Door: deadletter.DoorSQS}, Scope: "p",
			MessageID: "evt_2", Record: sqsRec, Reason: "x"})
		return err
	}))
	require.Equal(t, map[string]any{"extra": "kept"}, given, "the given map is not changed")
	letters, err := s.List(ctx, db.Pool, deadletter.Filter{AfterID: ids[0] - 1, Limit: 2})
	require.NoError(t, err)
	require.Len(t, letters, 2)
	k, q := letters[0], letters[1]
	require.Nil(t, k.Record)
	require.Equal(t, map[string]any{
		"extra": "kept", "topic": "payments", "partition": float64(2), "offset": float64(1 << 40), "key": "cus_1",
		"timestamp": "2026-12-01T16:00:00.000000005Z", "dedup_id": "kafka-position:payments/2/1099511627776",
	}, k.Metadata)
	require.Equal(t, map[string][]string{"given": {"1"}, "x-tag": {"a", "b\uFFFD"}, "e": {""}}, k.Headers)
	require.Equal(t, map[string]any{
		"subscription": "orders", "broker_message_id": "b5f7", "ordered": true, "delivery_attempt": float64(2),
		"timestamp": "2026-12-01T16:00:00.000000005Z",
	}, q.Metadata)
	require.Equal(t, map[string][]string{"message-id": {"evt_2"}}, q.Headers)

	back := deadletter.RecordOf(k)
	require.True(t, at.Equal(back.Time))
	back.Time = kafkaRec.Time
	require.ElementsMatch(t, []deadletter.Header{{Key: "given", Value: []byte("1")}, {Key: "x-tag", Value: []byte("a")}, {Key: "x-tag", Value: []byte("b\uFFFD")}, {Key: "e", Value: []byte{}}}, back.Headers)
	require.Equal(t, kafkaRec.Topic, back.Topic)
	require.Equal(t, kafkaRec.Partition, back.Partition)
	require.Equal(t, kafkaRec.Offset, back.Offset)
	require.Equal(t, kafkaRec.Key, back.Key)
	require.Equal(t, kafkaRec.DedupID, back.DedupID)
	backQ := deadletter.RecordOf(q)
	require.Equal(t, sqsRec.Attributes, backQ.Attributes)
	require.Equal(t, sqsRec.Subscription, backQ.Subscription)
	require.Equal(t, sqsRec.BrokerMessageID, backQ.BrokerMessageID)
	require.Equal(t, sqsRec.Ordered, backQ.Ordered)
	require.Equal(t, sqsRec.DeliveryAttempt, backQ.DeliveryAttempt)
	require.Nil(t, backQ.Key)
}

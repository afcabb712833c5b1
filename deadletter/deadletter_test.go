package deadletter_test

import (
	"context"
	"errors"
	"testing"

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
		Pipeline: "stripe", Scope: "stripe", MessageID: "evt_1", Payload: []byte(`{"id":"evt_1"}`),
		Headers: map[string][]string{"Content-Type": {"application/json"}}, Metadata: map[string]any{"path": "/webhooks/stripe"},
		Reason: "23505: duplicate key", Attempts: 1,
	})
	require.NoError(t, err)
	_, err = s.WriteTx(ctx, tx, &deadletter.Letter{Pipeline: "ledger", Scope: "ledger", Reason: "no message id", Attempts: 1})
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
	require.Equal(t, "/webhooks/stripe", stripe[0].Metadata["path"])

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
		id, err = s.WriteTx(ctx, tx, &deadletter.Letter{Pipeline: "p", Scope: "p", MessageID: "m", Reason: "boom", Attempts: 1})
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

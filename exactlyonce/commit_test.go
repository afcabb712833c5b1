package exactlyonce_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/exactlyonce"
	"github.com/idemd/idemd/internal/pgtest"
)

// TestCommitWithoutAnswer: the connection is cut right after COMMIT was sent. The server
// committed; the unit asks another connection and reports the messages Applied, as they are,
// instead of retrying them into "duplicate" (or failing a request that succeeded).
func TestCommitWithoutAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cut := pgtest.NewCommitCut(t)
	u := newUnit(t, b.db, cut.Pool(t, 4), nil)
	m, api := b.msg("a", 1), b.msg("k", 2)
	m.Answer = nil

	cutDone := cut.Arm(true)
	require.NoError(t, u.Apply(context.Background(), []*exactlyonce.Message{m}))
	<-cutDone
	require.Equal(t, exactlyonce.Applied, m.Outcome)
	require.Equal(t, 1, b.db.Count(t, "{schema}.effects WHERE id = 'a'"))

	// The same for an API request's effect transaction.
	token, err := u.Reserve(context.Background(), api, 0)
	require.NoError(t, err)
	cutDone = cut.Arm(true)
	require.NoError(t, u.ApplyReserved(context.Background(), api, token))
	<-cutDone
	require.Equal(t, exactlyonce.Applied, api.Outcome)
	require.JSONEq(t, `{"id":"k"}`, string(api.Response.Body))
	require.Equal(t, 1, b.db.Count(t, "{schema}.effects WHERE id = 'k'"))
}

// TestCommitNeverSent: the connection is cut instead of sending COMMIT. The server rolls
// back; the unit learns it and retries, so the message is applied once, by the retry.
func TestCommitNeverSent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cut := pgtest.NewCommitCut(t)
	u := newUnit(t, b.db, cut.Pool(t, 4), nil)
	m := b.msg("a", 1)
	m.Answer = nil
	cutDone := cut.Arm(false)
	require.NoError(t, u.Apply(context.Background(), []*exactlyonce.Message{m}))
	<-cutDone
	require.Equal(t, exactlyonce.Applied, m.Outcome)
	require.Equal(t, 1, b.db.Count(t, "{schema}.effects"))
}

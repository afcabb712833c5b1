package exactlyonce_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/exactlyonce"
	"github.com/idemd/idemd/processed"
)

func TestReserveThenApplyReserved(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	m := b.msg("k", 1)
	token, err := b.unit.Reserve(ctx, m, 0)
	require.NoError(t, err)
	require.NotEqual(t, uuid.Nil, token)
	require.Equal(t, exactlyonce.Pending, m.Outcome)

	// While reserved, another claimer sees it in flight at once (no blocking), or a
	// conflict for another payload.
	other := b.msg("k", 1)
	_, err = b.unit.Reserve(ctx, other, 0)
	require.NoError(t, err)
	require.Equal(t, exactlyonce.InFlight, other.Outcome)
	changed := b.msg("k", 1)
	changed.Fingerprint = []byte("changed")
	_, err = b.unit.Reserve(ctx, changed, 0)
	require.NoError(t, err)
	require.Equal(t, exactlyonce.Conflict, changed.Outcome)

	require.NoError(t, b.unit.ApplyReserved(ctx, m, token))
	require.Equal(t, exactlyonce.Applied, m.Outcome)
	require.JSONEq(t, `{"id":"k"}`, string(m.Response.Body))

	again := b.msg("k", 1)
	_, err = b.unit.Reserve(ctx, again, 0)
	require.NoError(t, err)
	require.Equal(t, exactlyonce.Duplicate, again.Outcome)
	require.Equal(t, m.Response.Body, again.Response.Body)
	require.Equal(t, 1, b.db.Count(t, "{schema}.effects"))
}

// TestReserveWaits: with a wait, a request for a key in flight is answered with the first
// one's result once it commits, instead of "in flight".
func TestReserveWaits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	m := b.msg("k", 1)
	token, err := b.unit.Reserve(ctx, m, 0)
	require.NoError(t, err)

	waiter := b.msg("k", 1)
	done := make(chan error, 1)
	go func() {
		_, err := b.unit.Reserve(ctx, waiter, 10*time.Second)
		done <- err
	}()
	require.NoError(t, b.unit.ApplyReserved(ctx, m, token))
	require.NoError(t, <-done)
	require.Equal(t, exactlyonce.Duplicate, waiter.Outcome)
	require.Equal(t, m.Response.Body, waiter.Response.Body)
}

// TestApplyReservedFailureReleases: a transient failure gives the key back at once, so the
// retry runs now; a permanent one stores the failure answer.
func TestApplyReservedFailureReleases(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	m := b.msg("k", 1)
	token, err := b.unit.Reserve(ctx, m, 0)
	require.NoError(t, err)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	require.Error(t, b.unit.ApplyReserved(cctx, m, token))
	require.Zero(t, b.db.Count(t, "{schema}.processed_messages"), "released")

	bad := b.msg("k", -1)
	token, err = b.unit.Reserve(ctx, bad, 0)
	require.NoError(t, err)
	require.NoError(t, b.unit.ApplyReserved(ctx, bad, token))
	require.Equal(t, exactlyonce.DeadLettered, bad.Outcome)
	require.Equal(t, 422, bad.Response.Status)
	require.Equal(t, 1, b.db.Count(t, "{schema}.processed_messages WHERE status = 'dead' AND response_status = 422"))
}

// TestLeaseTakeover: a reservation whose holder died is taken over after its lease by a
// claimer with the same payload; the old holder can no longer commit.
func TestLeaseTakeover(t *testing.T) {
	t.Parallel()
	b := setup(t)
	store, err := processed.New(&processed.Config{Schema: b.db.Schema, Lease: 50 * time.Millisecond})
	require.NoError(t, err)
	u := newUnit(t, b.db, b.db.Pool, func(c *exactlyonce.Config) { c.Processed = store })
	ctx := context.Background()
	old := b.msg("k", 1)
	oldToken, err := u.Reserve(ctx, old, 0)
	require.NoError(t, err)
	var taken *exactlyonce.Message
	var newToken uuid.UUID
	require.Eventually(t, func() bool {
		taken = b.msg("k", 1)
		newToken, err = u.Reserve(ctx, taken, 0)
		return err == nil && newToken != uuid.Nil
	}, 5*time.Second, 20*time.Millisecond)
	require.ErrorIs(t, u.ApplyReserved(ctx, old, oldToken), processed.ErrLeaseLost)
	require.NoError(t, u.ApplyReserved(ctx, taken, newToken))
	require.Equal(t, 1, b.db.Count(t, "{schema}.effects"))
}

// TestApplyWaitsForAReservation: a batch message whose id is held by a reservation is tried
// again until the reservation is settled, in one place (Apply), and ends a duplicate.
func TestApplyWaitsForAReservation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	api := b.msg("k", 1)
	token, err := b.unit.Reserve(ctx, api, 0)
	require.NoError(t, err)

	batch := []*exactlyonce.Message{b.msg("other", 2), b.msg("k", 1)}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		require.NoError(t, b.unit.Apply(ctx, batch))
	}()
	require.NoError(t, b.unit.ApplyReserved(ctx, api, token))
	wg.Wait()
	require.Equal(t, exactlyonce.Applied, batch[0].Outcome)
	require.Equal(t, exactlyonce.Duplicate, batch[1].Outcome)
	require.Equal(t, 2, b.db.Count(t, "{schema}.effects"))
}

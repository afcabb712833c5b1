package exactlyonce_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/exactlyonce"
)

// TestApplyReturnsOnlyOnceHeldIDsAreSettled: Apply returns only when every message of its
// batch is settled. A message whose id an API request holds reserved (in flight: the
// request's effect has not committed) is asked again until the reservation ends; Apply
// never returns it as done while it is neither applied nor a duplicate, or a door would
// acknowledge a message that nothing applied (SPEC 1.2), lost if the request then fails.
// Here Apply is seen to meet the reservation (its first transaction commits with the id in
// flight) before the request completes. Returning with the id still in flight passed
// before: TestApplyWaitsForAReservation mostly ran the request first, and Apply then found
// a duplicate without waiting.
func TestApplyReturnsOnlyOnceHeldIDsAreSettled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	met := make(chan struct{})
	var once sync.Once
	u := newUnit(t, b.db, b.db.Pool, func(cfg *exactlyonce.Config) {
		cfg.BeforeCommit = func(msgs []*exactlyonce.Message) {
			for _, m := range msgs {
				if m.ID == "k" && m.Outcome == exactlyonce.InFlight {
					once.Do(func() { close(met) })
				}
			}
		}
	})
	api := b.msg("k", 1)
	token, err := u.Reserve(ctx, api, 0)
	require.NoError(t, err)

	batch := []*exactlyonce.Message{b.msg("other", 2), b.msg("k", 1)}
	applied := make(chan error, 1)
	go func() { applied <- u.Apply(ctx, batch) }()
	select { // Apply committed "other" and found "k" held
	case <-met:
	case err := <-applied:
		t.Fatalf("Apply returned (%v) without meeting the reservation", err)
	case <-time.After(30 * time.Second):
		t.Fatal("Apply did not meet the reservation")
	}
	require.NoError(t, u.ApplyReserved(ctx, api, token))
	require.NoError(t, <-applied)
	require.Equal(t, exactlyonce.Applied, batch[0].Outcome)
	require.Equal(t, exactlyonce.Duplicate, batch[1].Outcome, "Apply returned once the reservation was settled")
	require.Equal(t, 2, b.db.Count(t, "{schema}.effects"))
}

package pgpool_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgpool"
	"github.com/idemd/idemd/internal/pgtest"
)

// Warm leaves every connection of the pool open and idle.
func TestWarmOpensEveryConnection(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, 6)
	failed, err := pgpool.Warm(context.Background(), pool)
	require.NoError(t, err)
	require.Zero(t, failed)
	require.EqualValues(t, 6, pool.Stat().TotalConns())
	require.EqualValues(t, 6, pool.Stat().IdleConns())
}

// A context that ends first leaves the rest to be opened on demand, and says so.
func TestWarmReportsWhatItCouldNotOpen(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, 4)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	failed, err := pgpool.Warm(ctx, pool)
	require.ErrorIs(t, err, context.Canceled)
	require.Positive(t, failed)
	require.NoError(t, pool.Ping(context.Background()), "the pool still works")
}

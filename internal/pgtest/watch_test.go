package pgtest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
)

// TestWatch: a watcher wakes on the commits of another connection (here, rows inserted one
// transaction at a time by a goroutine) until its condition holds, and gives up at its
// context's end.
func TestWatch(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	db.Exec(t, db.Q("CREATE TABLE {schema}.items (n int)"))
	w := pgtest.Watch(t, db.Q("{schema}.items"))

	go func() {
		ctx := context.Background()
		for i := range 3 {
			_, _ = db.Pool.Exec(ctx, db.Q("INSERT INTO {schema}.items VALUES ($1)"), i)
		}
	}()
	w.Until(t, 30*time.Second, "three rows", func() bool { return db.Count(t, "{schema}.items") == 3 })

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, w.Wait(ctx, func() bool { return false }), context.DeadlineExceeded)
}

// TestWatchesStartTogether: watchers started at once by parallel tests all get the shared
// notifying function; none meets another's replace of it ("tuple concurrently updated").
func TestWatchesStartTogether(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	db.Exec(t, db.Q("CREATE TABLE {schema}.items (n int)"))
	for i := range 12 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Parallel()
			pgtest.Watch(t, db.Q("{schema}.items"))
		})
	}
}

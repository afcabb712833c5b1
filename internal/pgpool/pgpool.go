// Package pgpool opens a pgx pool's connections ahead of its first load.
package pgpool

import (
	"cmp"
	"context"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Warm opens the pool's MaxConns connections at once and puts them back idle, so that the
// first burst of work does not wait for PostgreSQL to start a backend per connection
// (pgxpool dials on demand). It returns how many could not be opened, with the first
// error; those are opened on demand later. A connection left unused is closed after the
// pool's MaxConnIdleTime (30 minutes by default).
func Warm(ctx context.Context, pool *pgxpool.Pool) (failed int, err error) {
	conns := make([]*pgxpool.Conn, pool.Config().MaxConns)
	errs := make([]error, len(conns))
	var wg sync.WaitGroup
	for i := range conns {
		// Each Acquire that finds no idle connection opens one, as long as the others hold
		// theirs.
		wg.Go(func() { conns[i], errs[i] = pool.Acquire(ctx) })
	}
	wg.Wait()
	for i, c := range conns {
		if c == nil {
			failed++
			err = cmp.Or(err, errs[i])
			continue
		}
		c.Release()
	}
	return failed, err
}

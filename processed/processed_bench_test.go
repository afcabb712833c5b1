package processed_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/processed"
)

// BenchmarkClaimBatch measures claims per second in batches of 1, 100 and 1000 new ids, and
// of 1000 ids of which every fifth is known (a redelivery, as in idemd-bench's consumer
// load), one transaction (and one fsync) per batch; and the backend's CPU per claim
// (pg-µs/claim) when the server runs on this machine. Then the same with five epochs
// (IDEMD_PROCESSED_PARTITION_INTERVAL), where a new id is looked for in the four older
// ones, which hold the ids claimed so far.
func BenchmarkClaimBatch(b *testing.B) {
	db := pgtest.New(b)
	store, err := processed.New(&processed.Config{Schema: db.Schema})
	require.NoError(b, err)
	ctx := context.Background()
	run := 0
	for _, c := range []struct {
		size   int
		known  bool
		epochs int
	}{{1, false, 1}, {100, false, 1}, {1000, false, 1}, {1000, true, 1}, {1, false, 5}, {1000, false, 5}, {1000, true, 5}} {
		name := fmt.Sprintf("batch=%d", c.size)
		if c.known {
			name += ",known=20%"
		}
		name += fmt.Sprintf(",epochs=%d", c.epochs)
		for current, err := store.CurrentEpoch(ctx, db.Pool); int(current)+1 < c.epochs; current, err = store.OpenEpoch(ctx, db.Pool, 0) {
			require.NoError(b, err)
		}
		size := c.size
		b.Run(name, func(b *testing.B) {
			run++
			claims := make([]processed.Claim, size)
			conn, err := db.Pool.Acquire(ctx)
			require.NoError(b, err)
			defer conn.Release()
			server := pgtest.StartBackendCPU(conn.Conn())
			start := time.Now()
			for i := 0; i < b.N; i++ {
				for j := range claims {
					id := fmt.Sprintf("%d-%d-%d", run, i, j)
					if c.known && j%5 == 4 && i > 0 {
						id = fmt.Sprintf("%d-%d-%d", run, i-1, j-1) // claimed by the previous batch
					}
					claims[j] = processed.Claim{Scope: "bench", MessageID: id, Fingerprint: []byte("fp")}
				}
				tx, err := conn.Begin(ctx)
				require.NoError(b, err)
				res, err := store.ClaimBatchTx(ctx, tx, claims)
				require.NoError(b, err)
				require.Equal(b, processed.Claimed, res[0].Outcome)
				require.NoError(b, tx.Commit(ctx))
			}
			b.ReportMetric(float64(b.N*size)/time.Since(start).Seconds(), "claims/s")
			server.Report(b, b.N*size, "claim")
		})
	}
}

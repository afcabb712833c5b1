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

// BenchmarkClaimBatch measures claims per second in batches of 1 and 100 new ids, one
// transaction (and one fsync) per batch; "single" is the one-claim-per-transaction baseline
// of the same run.
func BenchmarkClaimBatch(b *testing.B) {
	db := pgtest.New(b)
	store, err := processed.New(&processed.Config{Schema: db.Schema})
	require.NoError(b, err)
	ctx := context.Background()
	run := 0
	for _, size := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			run++
			claims := make([]processed.Claim, size)
			start := time.Now()
			for i := 0; i < b.N; i++ {
				for j := range claims {
					claims[j] = processed.Claim{Scope: "bench", MessageID: fmt.Sprintf("%d-%d-%d", run, i, j), Fingerprint: []byte("fp")}
				}
				tx, err := db.Pool.Begin(ctx)
				require.NoError(b, err)
				res, err := store.ClaimBatchTx(ctx, tx, claims)
				require.NoError(b, err)
				require.Equal(b, processed.Claimed, res[0].Outcome)
				require.NoError(b, tx.Commit(ctx))
			}
			b.ReportMetric(float64(b.N*size)/time.Since(start).Seconds(), "claims/s")
		})
	}
}

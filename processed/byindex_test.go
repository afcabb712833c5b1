package processed_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/processed"
)

// A connection whose generic plans were made while processed_messages looked empty (its
// statistics an empty table's) still finds its rows by index once the table has grown:
// the claim's probe of the older epoch, the lookup of known ids, the completion of a
// reservation and the stale mark read no partition whole. And the effects' statements that
// follow in the transaction are planned with the session's settings again.
func TestClaimStatementsFindRowsByIndex(t *testing.T) {
	t.Parallel()
	b := setup(t, pgtest.Options{}, processed.Config{})
	ctx := context.Background()
	b.openEpoch(t)
	b.db.Exec(t, b.db.Q(`ANALYZE {schema}.processed_messages`)) // both epochs empty

	conn, err := b.db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan")
	require.NoError(t, err)
	defer conn.Exec(ctx, "RESET plan_cache_mode") //nolint:errcheck // back to the pool as it came
	// run claims (and completes a reservation) in one transaction on conn, and returns the
	// sequential scans of processed_messages' partitions it made.
	run := func(round int) (seqScans int, seqscanAfter string) {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
		// The backend's counts not yet reported: they grow within a transaction only.
		const scans = `SELECT coalesce(sum(seq_scan), 0) FROM pg_stat_xact_user_tables WHERE schemaname = $1 AND relname LIKE 'processed_messages_e%'`
		var before int
		require.NoError(t, tx.QueryRow(ctx, scans, b.db.Schema).Scan(&before))
		res, err := b.store.ClaimBatchTx(ctx, tx, []processed.Claim{
			{Scope: "s", MessageID: "known", Fingerprint: fp},
			{Scope: "s", MessageID: fmt.Sprint("new-", round), Fingerprint: fp},
			{Scope: "s", MessageID: fmt.Sprint("reserved-", round), Fingerprint: fp, Reserve: true},
		})
		require.NoError(t, err)
		require.NoError(t, tx.QueryRow(ctx, "SELECT current_setting('enable_seqscan')").Scan(&seqscanAfter))
		require.NoError(t, b.store.CompleteBatchTx(ctx, tx, []processed.Completion{{Scope: "s", MessageID: fmt.Sprint("reserved-", round), State: processed.StateDone, LeaseToken: res[2].LeaseToken}}))
		require.NoError(t, b.store.MarkStaleTx(ctx, tx, "s", fmt.Sprint("new-", round), processed.Stale{Entity: "e", Version: "1"}))
		require.NoError(t, tx.QueryRow(ctx, scans, b.db.Schema).Scan(&seqScans))
		require.NoError(t, tx.Commit(ctx))
		return seqScans - before, seqscanAfter
	}
	// The plans are made on the empty tables.
	b.db.Exec(t, b.db.Q(`INSERT INTO {schema}.processed_messages (scope, message_id, fingerprint, status, expires_at, epoch)
VALUES ('s', 'known', $1, 'done', now() + interval '1 hour', 0)`), fp)
	run(0)
	// Then the tables grow, and their statistics do not follow (no ANALYZE).
	b.db.Exec(t, b.db.Q(`INSERT INTO {schema}.processed_messages (scope, message_id, fingerprint, status, expires_at, epoch)
SELECT 's', 'filler-' || g, '\x00', 'done', now() + interval '1 hour', g % 2 FROM generate_series(1, 20000) g`))
	seqScans, after := run(1)
	require.Zero(t, seqScans, "sequential scans of processed_messages' partitions")
	require.Equal(t, "on", after, "the scans' settings are back to the session's for the effects")
}

// The pruner's statements, by expires_at, also keep to the index once the partition has
// outgrown the statistics their generic plans were made on.
func TestPrunerFindsRowsByIndex(t *testing.T) {
	t.Parallel()
	b := setup(t, pgtest.Options{}, processed.Config{})
	ctx := context.Background()
	b.db.Exec(t, b.db.Q(`ANALYZE {schema}.processed_messages`))
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	cfg.MaxConns = 1
	cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	prune := func() {
		_, err := b.store.PruneOutlived(ctx, pool, 0)
		require.NoError(t, err)
		_, err = b.store.DropExpiredEpochs(ctx, pool)
		require.NoError(t, err)
		// The backend reports its counts when it goes idle after this statement.
		_, err = pool.Exec(ctx, "SELECT pg_stat_force_next_flush()")
		require.NoError(t, err)
	}
	scanned := func() (n int) {
		conn, err := b.db.Pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		_, err = conn.Exec(ctx, "SELECT pg_stat_clear_snapshot()")
		require.NoError(t, err)
		require.NoError(t, conn.QueryRow(ctx, `SELECT coalesce(sum(seq_tup_read), 0) FROM pg_stat_user_tables WHERE schemaname = $1 AND relname LIKE 'processed_messages_e%'`, b.db.Schema).Scan(&n))
		return n
	}
	prune() // the plans are made on the empty tables
	b.openEpoch(t)
	b.db.Exec(t, b.db.Q(`INSERT INTO {schema}.processed_messages (scope, message_id, fingerprint, status, expires_at, epoch)
SELECT 's', 'f-' || g, '\x00', 'done', now() + interval '1 hour', g % 2 FROM generate_series(1, 20000) g`))
	before := scanned()
	prune()
	prune()
	require.Zero(t, scanned()-before, "rows of processed_messages read by sequential scans")
}

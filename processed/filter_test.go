package processed_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/processed"
)

// setupFiltered is setup with an EpochFilter of the test's schema given to the store.
func setupFiltered(t *testing.T, opts pgtest.Options, maxBytes int64) (*bundle, *processed.EpochFilter) {
	t.Helper()
	db := pgtest.NewWithOptions(t, opts)
	f := processed.NewEpochFilter(db.Schema, maxBytes)
	store, err := processed.New(&processed.Config{Schema: db.Schema, Filter: f})
	require.NoError(t, err)
	return &bundle{db: db, store: store}, f
}

func (b *bundle) claimAll(t *testing.T, claims []processed.Claim) []processed.Outcome {
	t.Helper()
	var res []processed.Result
	require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
		var err error
		res, err = b.store.ClaimBatchTx(context.Background(), tx, claims)
		return err
	}))
	out := make([]processed.Outcome, len(res))
	for i, r := range res {
		out[i] = r.Outcome
	}
	return out
}

// claimsOf are claims of ids, with a shared scope or with a reservation among them (the
// per-row columns).
func claimsOf(ids []string, shared bool) []processed.Claim {
	claims := make([]processed.Claim, len(ids))
	for i, id := range ids {
		claims[i] = processed.Claim{Scope: "s", MessageID: id, Fingerprint: fp, Reserve: !shared && i == 0}
	}
	return claims
}

// idsOf are n ids named prefix-0 to prefix-(n-1).
func idsOf(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

func outcomes(o processed.Outcome, n int) []processed.Outcome {
	out := make([]processed.Outcome, n)
	for i := range out {
		out[i] = o
	}
	return out
}

func refresh(t *testing.T, b *bundle, f *processed.EpochFilter) processed.FilterRefresh {
	t.Helper()
	res, err := f.Refresh(context.Background(), b.db.Pool)
	require.NoError(t, err)
	return res
}

// With a filter, every id of the older epochs stays known: the ids it holds are looked up,
// and while the current epoch is not the one it was built under (an epoch opened since,
// or the schema made again) every id is.
func TestFilterKeepsEveryIDKnown(t *testing.T) {
	t.Parallel()
	b, f := setupFiltered(t, pgtest.Options{}, 0)
	old := idsOf("old", 50)
	require.Equal(t, outcomes(processed.Claimed, 50), b.claimAll(t, claimsOf(old, true)))
	res := refresh(t, b, f)
	require.True(t, res.Built)
	require.Zero(t, res.IDs, "one epoch: nothing older to hold")

	b.openEpoch(t)
	// Not refreshed yet: built under epoch 0, so the claims look every id up.
	require.Equal(t, outcomes(processed.Duplicate, 50), b.claimAll(t, claimsOf(old, true)))
	res = refresh(t, b, f)
	require.Equal(t, processed.FilterRefresh{Built: true, Epoch: 1, IDs: 50, Took: res.Took}, res)
	require.Equal(t, int64(50), f.IDs())
	for _, shared := range []bool{true, false} {
		require.Equal(t, outcomes(processed.Duplicate, 50), b.claimAll(t, claimsOf(old, shared)), "shared %v", shared)
	}
	// A conflict too: the stored fingerprint differs.
	c := b.claim(t, processed.Claim{Scope: "s", MessageID: "old-7", Fingerprint: []byte("other")})
	require.Equal(t, processed.Conflict, c.Outcome)
	mid := idsOf("mid", 30)
	require.Equal(t, outcomes(processed.Claimed, 30), b.claimAll(t, claimsOf(mid, true)))
	require.False(t, refresh(t, b, f).Built, "nothing changed")

	// An epoch opens; the filter, built under epoch 1, holds none of mid's ids, which are
	// in epoch 1, now older: they are looked up all the same.
	b.openEpoch(t)
	for _, shared := range []bool{true, false} {
		require.Equal(t, outcomes(processed.Duplicate, 30), b.claimAll(t, claimsOf(mid, shared)), "shared %v", shared)
	}
	res = refresh(t, b, f)
	require.True(t, res.Built)
	require.Equal(t, int64(80), res.IDs)
	require.Equal(t, outcomes(processed.Duplicate, 30), b.claimAll(t, claimsOf(mid, true)))

	// The schema made again (a restore, say) with an epoch of the same number: its older
	// epochs hold an id that the filter never saw. The current epoch opened at another
	// time, so the claims look the ids up.
	ctx := context.Background()
	_, err := b.db.Pool.Exec(ctx, b.db.Q(`INSERT INTO {schema}.processed_messages (scope, message_id, fingerprint, status, expires_at, epoch)
VALUES ('s', 'restored', $1, 'done', now() + interval '1 day', 0)`), fp)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, b.db.Q(`UPDATE {schema}.processed_epochs SET opened_at = opened_at + interval '1 second' WHERE epoch = 2`))
	require.NoError(t, err)
	require.Equal(t, []processed.Outcome{processed.Duplicate}, b.claimAll(t, claimsOf([]string{"restored"}, true)))
	require.Equal(t, []processed.Outcome{processed.Duplicate}, b.claimAll(t, claimsOf([]string{"restored"}, false)))
}

// The filter spares the older epochs' lookup for new ids: with it, the older partition is
// read only for the few ids it holds by chance (false positives), where without it, or
// before it is built under the current epoch, every new id is looked up.
func TestFilterSparesTheOlderEpochsLookup(t *testing.T) {
	t.Parallel()
	b, f := setupFiltered(t, pgtest.Options{}, 0)
	old := idsOf("old", 2000)
	require.Equal(t, outcomes(processed.Claimed, len(old)), b.claimAll(t, claimsOf(old, true)))
	b.openEpoch(t)
	const n = 200
	for _, shared := range []bool{true, false} {
		got := b.indexScans(t, b.store, fmt.Sprint("stale-", shared), n, shared)
		require.Equal(t, map[string]int{"processed_messages_e0": n, "processed_messages_e1": n}, got, "before the filter is built (shared %v)", shared)
	}
	refresh(t, b, f)
	for _, shared := range []bool{true, false} {
		got := b.indexScans(t, b.store, fmt.Sprint("new-", shared), n, shared)
		require.Equal(t, n, got["processed_messages_e1"], "the insert's conflict checks (shared %v)", shared)
		// 1 % false positives: about 2 of 200; 20 would be ten times the rate.
		require.Less(t, got["processed_messages_e0"], n/10, "lookups in the older epoch (shared %v)", shared)
		t.Logf("shared %v: %d of %d new ids looked up in the older epoch", shared, got["processed_messages_e0"], n)
	}
	// A store of the same schema without the filter looks every id up.
	plain, err := processed.New(&processed.Config{Schema: b.db.Schema})
	require.NoError(t, err)
	got := b.indexScans(t, plain, "plain", n, true)
	require.Equal(t, map[string]int{"processed_messages_e0": n, "processed_messages_e1": n}, got)
}

// The filter spares the older epochs' lookup for redelivered ids too: an id that claimNew
// did not claim is read back from the current epoch only, unless the filter may hold it,
// or was built under another epoch, or there is none (BENCHMARKS.md, phase 34). Counted in
// blocks of the older partition's primary key, whatever plan the lookup had.
func TestFilterSparesTheOlderEpochsLookupOfKnownIDs(t *testing.T) {
	t.Parallel()
	b, f := setupFiltered(t, pgtest.Options{}, 0)
	// Enough older ids that the lookup of each id is an index probe of each partition
	// (with a few thousand the planner read the older primary key whole, a few blocks).
	for k := range 10 {
		require.Equal(t, outcomes(processed.Claimed, 2000), b.claimAll(t, claimsOf(idsOf(fmt.Sprint("old", k), 2000), true)))
	}
	b.openEpoch(t)
	const n = 200
	current := idsOf("current", n)
	require.Equal(t, outcomes(processed.Claimed, n), b.claimAll(t, claimsOf(current, true)))

	// Before the filter is built under the current epoch: every known id is looked up in
	// the older epoch too (claimNew's probe, then the lookup), a block or more each.
	for _, shared := range []bool{true, false} {
		got := b.pkeyBlocks(t, b.store, claimsOf(current, shared), processed.Duplicate)
		require.GreaterOrEqual(t, got["processed_messages_e0_pkey"], int64(2*n), "before the filter is built (shared %v)", shared)
	}
	refresh(t, b, f)
	for _, shared := range []bool{true, false} {
		got := b.pkeyBlocks(t, b.store, claimsOf(current, shared), processed.Duplicate)
		// 1 % false positives, each read twice, two blocks a read: about 8; 40 would be
		// five times the rate.
		require.Less(t, got["processed_messages_e0_pkey"], int64(n/5), "reads of the older epoch (shared %v)", shared)
		t.Logf("shared %v: %d blocks of the older epoch's primary key read for %d known ids", shared, got["processed_messages_e0_pkey"], n)
	}
	// The older epoch's ids are still found there, as duplicates and as conflicts.
	old := idsOf("old3", 50)
	require.Equal(t, outcomes(processed.Duplicate, 50), b.claimAll(t, claimsOf(old, true)))
	require.Equal(t, processed.Conflict, b.claim(t, processed.Claim{Scope: "s", MessageID: "old3-9", Fingerprint: []byte("other")}).Outcome)
	// A store of the same schema without the filter reads the older epoch for each.
	plain, err := processed.New(&processed.Config{Schema: b.db.Schema})
	require.NoError(t, err)
	got := b.pkeyBlocks(t, plain, claimsOf(current, true), processed.Duplicate)
	require.GreaterOrEqual(t, got["processed_messages_e0_pkey"], int64(2*n))
}

// pkeyBlocks claims claims with store in one transaction, requires each outcome to be want,
// and returns the blocks it read (from shared buffers or not) of each partition's primary
// key.
func (b *bundle) pkeyBlocks(t *testing.T, store *processed.Store, claims []processed.Claim, want processed.Outcome) map[string]int64 {
	t.Helper()
	const q = `SELECT c.relname, pg_stat_get_xact_blocks_fetched(c.oid) FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname LIKE 'processed_messages_e%_pkey'`
	return b.xactCounts(t, store, claims, want, q)
}

// A filter whose ids would not fit in its bytes is not built, and the claims look every
// new id up.
func TestFilterTooLargeLooksEveryIDUp(t *testing.T) {
	t.Parallel()
	b, f := setupFiltered(t, pgtest.Options{}, 64)
	old := idsOf("old", 100)
	b.claimAll(t, claimsOf(old, true))
	b.openEpoch(t)
	res := refresh(t, b, f)
	require.True(t, res.TooLarge)
	require.Zero(t, f.IDs())
	require.Equal(t, outcomes(processed.Duplicate, 100), b.claimAll(t, claimsOf(old, true)))
	got := b.indexScans(t, b.store, "new", 40, true)
	require.Equal(t, map[string]int{"processed_messages_e0": 40, "processed_messages_e1": 40}, got)
}

func TestFilterOfAnotherSchemaRefused(t *testing.T) {
	t.Parallel()
	_, err := processed.New(&processed.Config{Schema: "a", Filter: processed.NewEpochFilter("b", 0)})
	require.ErrorContains(t, err, `Filter holds the epochs of another schema: Schema is "a", the filter's "b"`)
}

// TestFilterRebuiltDuringClaimsOfOneID is TestEpochSwitchDuringClaimsOfOneID with the
// filter built again as fast as it can be, beside the claims and the epochs opening: the
// claims that skip the lookup of an id that an older epoch holds would claim it twice.
func TestFilterRebuiltDuringClaimsOfOneID(t *testing.T) {
	t.Parallel()
	claimsDuringEpochSwitches(t, func(opts pgtest.Options) (*bundle, *processed.EpochFilter) {
		return setupFiltered(t, opts, 0)
	})
}

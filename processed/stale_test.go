package processed_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/processed"
)

// A record marked stale, queued with the claim's transaction (QueueStale) or at once
// (MarkStaleTx, in an older epoch as a replayed letter's record may be), stays done: a
// redelivery is a duplicate. The operators' reads say it is stale, with its entity and
// version, and the list filters by it.
func TestStaleRecords(t *testing.T) {
	t.Parallel()
	b := setup(t, pgtest.Options{}, processed.Config{})
	ctx := context.Background()
	b.claim(t, processed.Claim{Scope: "s", MessageID: "old", Fingerprint: fp})
	b.openEpoch(t)
	require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
		res, err := b.store.ClaimBatchTx(ctx, tx, []processed.Claim{
			{Scope: "s", MessageID: "applied", Fingerprint: fp}, {Scope: "s", MessageID: "stale", Fingerprint: fp},
		})
		require.NoError(t, err)
		require.Equal(t, processed.Claimed, res[1].Outcome)
		batch := &pgx.Batch{}
		b.store.QueueStale(batch, "s", "stale", processed.Stale{Entity: "cus_1", Version: "2.50"})
		if err := tx.SendBatch(ctx, batch).Close(); err != nil {
			return err
		}
		return b.store.MarkStaleTx(ctx, tx, "s", "old", processed.Stale{Entity: "cus_2", Version: "1767225600000000"})
	}))

	get := func(id string) *processed.Record {
		rec, err := b.store.GetRecord(ctx, b.db.Pool, "s", id)
		require.NoError(t, err)
		require.Equal(t, processed.StateDone, rec.State, id)
		return rec
	}
	require.Nil(t, get("applied").Stale)
	require.Equal(t, &processed.Stale{Entity: "cus_1", Version: "2.50"}, get("stale").Stale)
	require.Equal(t, &processed.Stale{Entity: "cus_2", Version: "1767225600000000"}, get("old").Stale)
	for _, id := range []string{"applied", "stale", "old"} {
		require.Equal(t, processed.Duplicate, b.claim(t, processed.Claim{Scope: "s", MessageID: id, Fingerprint: fp}).Outcome, id)
	}

	list := func(stale *bool) []string {
		recs, err := b.store.ListRecords(ctx, b.db.Pool, processed.RecordFilter{Pipeline: "s", State: processed.StateDone, Stale: stale})
		require.NoError(t, err)
		var ids []string
		for _, r := range recs {
			require.Equal(t, r.MessageID != "applied", r.Stale != nil, r.MessageID)
			ids = append(ids, r.MessageID)
		}
		return ids
	}
	yes, no := true, false
	require.ElementsMatch(t, []string{"stale", "old"}, list(&yes))
	require.Equal(t, []string{"applied"}, list(&no))
	require.ElementsMatch(t, []string{"applied", "stale", "old"}, list(nil))
}

// A stale record whose retention has passed is a new message's when its id is claimed
// again, in its epoch or moved from an older one: the mark goes with the old message.
func TestTakeOverForgetsTheStaleMark(t *testing.T) {
	t.Parallel()
	b := setup(t, pgtest.Options{}, processed.Config{})
	ctx := context.Background()
	short := func(id string) {
		b.claim(t, processed.Claim{Scope: "s", MessageID: id, Fingerprint: fp, Retention: time.Millisecond})
		require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
			return b.store.MarkStaleTx(ctx, tx, "s", id, processed.Stale{Entity: "e", Version: "1"})
		}))
	}
	short("moved")
	b.openEpoch(t)
	short("in-place")
	time.Sleep(5 * time.Millisecond) // retention is measured by the database clock
	for _, id := range []string{"moved", "in-place"} {
		require.Equal(t, processed.Claimed, b.claim(t, processed.Claim{Scope: "s", MessageID: id, Fingerprint: fp}).Outcome, id)
		rec, err := b.store.GetRecord(ctx, b.db.Pool, "s", id)
		require.NoError(t, err)
		require.Nil(t, rec.Stale, id)
	}
}

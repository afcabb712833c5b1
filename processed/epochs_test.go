package processed_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/processed"
)

func (b *bundle) claim(t *testing.T, c processed.Claim) processed.Result {
	t.Helper()
	var res []processed.Result
	require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
		var err error
		res, err = b.store.ClaimBatchTx(context.Background(), tx, []processed.Claim{c})
		return err
	}))
	return res[0]
}

func (b *bundle) openEpoch(t *testing.T) int32 {
	t.Helper()
	epoch, err := b.store.OpenEpoch(context.Background(), b.db.Pool, 0)
	require.NoError(t, err)
	require.NotZero(t, epoch)
	return epoch
}

// An id stays known across epochs: a claim in a later epoch finds it in an older one, as a
// duplicate or a conflict, and new ids go to the current epoch.
func TestEpochsKeepEveryIDKnown(t *testing.T) {
	t.Parallel()
	b := setup(t, pgtest.Options{}, processed.Config{})
	ctx := context.Background()
	require.Equal(t, processed.Claimed, b.claim(t, processed.Claim{Scope: "s", MessageID: "a", Fingerprint: fp}).Outcome)
	require.Equal(t, processed.Claimed, b.claim(t, processed.Claim{Scope: "s", MessageID: "b", Fingerprint: fp}).Outcome)

	// Not due: the current epoch opened less than an hour ago.
	none, err := b.store.OpenEpoch(ctx, b.db.Pool, time.Hour)
	require.NoError(t, err)
	require.Zero(t, none)
	require.Equal(t, int32(1), b.openEpoch(t))
	require.Equal(t, processed.Duplicate, b.claim(t, processed.Claim{Scope: "s", MessageID: "a", Fingerprint: fp}).Outcome)
	require.Equal(t, processed.Conflict, b.claim(t, processed.Claim{Scope: "s", MessageID: "b", Fingerprint: []byte("other")}).Outcome)
	require.Equal(t, processed.Claimed, b.claim(t, processed.Claim{Scope: "s", MessageID: "c", Fingerprint: fp}).Outcome)
	// The shared-columns form (a subscription's batch) checks the older epochs as well.
	var res []processed.Result
	require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
		res, err = b.store.ClaimBatchTx(ctx, tx, []processed.Claim{
			{Scope: "s", MessageID: "a", Fingerprint: fp}, {Scope: "s", MessageID: "d", Fingerprint: fp},
		})
		return err
	}))
	require.Equal(t, []processed.Outcome{processed.Duplicate, processed.Claimed}, []processed.Outcome{res[0].Outcome, res[1].Outcome})

	require.Equal(t, int32(2), b.openEpoch(t))
	require.Equal(t, processed.Duplicate, b.claim(t, processed.Claim{Scope: "s", MessageID: "c", Fingerprint: fp}).Outcome)
	require.Equal(t, processed.Duplicate, b.claim(t, processed.Claim{Scope: "s", MessageID: "a", Fingerprint: fp}).Outcome)
	require.Equal(t, "0:a 0:b 1:c 1:d", b.db.Text(t, b.db.Q(`SELECT string_agg(epoch || ':' || message_id, ' ' ORDER BY message_id) FROM {schema}.processed_messages`)))
	// A partition opened by the pruner is vacuumed as soon as the first (migration 0006).
	require.Equal(t, 1, b.db.Count(t, "pg_class WHERE oid = $1::regclass AND 'autovacuum_vacuum_scale_factor=0.02' = ANY (reloptions)",
		b.db.Schema+".processed_messages_e2"))
}

// TestEpochSwitchDuringClaimsOfOneID: claimers of the same ids, each holding its claim
// uncommitted a moment, while epochs open as fast as they can. Without the epochs' lock a
// claim in a new epoch would not see an uncommitted claim of the same id in the epoch
// before, and both would insert: two effects. With it, each id is claimed once.
func TestEpochSwitchDuringClaimsOfOneID(t *testing.T) {
	t.Parallel()
	claimsDuringEpochSwitches(t, nil)
}

// claimsDuringEpochSwitches claims 40 ids, each by six claimers at once in three rounds
// (its later claims come after epochs opened), while epochs open every 3 ms; with a
// filter, it is built again without pause meanwhile. Each id must be claimed once.
func claimsDuringEpochSwitches(t *testing.T, filtered func(pgtest.Options) (*bundle, *processed.EpochFilter)) {
	const (
		claimers = 6
		ids      = 40
	)
	opts := pgtest.Options{MaxConns: claimers + 6}
	var (
		b *bundle
		f *processed.EpochFilter
	)
	if filtered != nil {
		b, f = filtered(opts)
	} else {
		b = setup(t, opts, processed.Config{})
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var opened, built atomic.Int32
	var loops sync.WaitGroup
	loops.Go(func() {
		for ctx.Err() == nil {
			epoch, err := b.store.OpenEpoch(ctx, b.db.Pool, 0)
			if err != nil && ctx.Err() == nil {
				t.Errorf("opening an epoch: %v", err)
				return
			}
			if epoch > 0 {
				opened.Add(1)
			}
			time.Sleep(3 * time.Millisecond)
		}
	})
	if f != nil {
		loops.Go(func() {
			for ctx.Err() == nil {
				res, err := f.Refresh(ctx, b.db.Pool)
				if err != nil && ctx.Err() == nil {
					t.Errorf("refreshing the filter: %v", err)
					return
				}
				if res.Built && res.IDs > 0 {
					built.Add(1)
				}
			}
		})
	}

	var claimed [ids]atomic.Int32
	for id := range ids {
		for range 3 {
			var wg sync.WaitGroup
			for range claimers {
				wg.Go(func() {
					time.Sleep(time.Duration(rand.IntN(6)) * time.Millisecond)
					err := b.inTx(t, func(tx pgx.Tx) error {
						res, err := b.store.ClaimBatchTx(ctx, tx, []processed.Claim{
							{Scope: "s", MessageID: fmt.Sprint(id), Fingerprint: fp},
							{Scope: "s", MessageID: fmt.Sprint("other-", id, "-", rand.Uint64()), Fingerprint: fp},
						})
						if err != nil {
							return err
						}
						if res[0].Outcome == processed.Claimed {
							claimed[id].Add(1)
						}
						_, err = tx.Exec(ctx, "SELECT pg_sleep(0.002)")
						return err
					})
					if err != nil {
						t.Errorf("claim of %d: %v", id, err)
					}
				})
			}
			wg.Wait()
		}
	}
	cancel()
	loops.Wait()
	for id := range ids {
		require.Equal(t, int32(1), claimed[id].Load(), "id %d claimed %d times", id, claimed[id].Load())
	}
	require.Equal(t, ids, b.db.Count(t, "{schema}.processed_messages WHERE message_id NOT LIKE 'other-%'"))
	require.Greater(t, opened.Load(), int32(ids/4), "epochs opened during the claims")
	if f != nil {
		require.Greater(t, built.Load(), int32(ids/4), "filters built during the claims")
	}
	t.Logf("%d epochs opened, %d filters built during %d ids × %d claimers × 3 rounds", opened.Load(), built.Load(), ids, claimers)
}

// An epoch is dropped once every record in it has expired and no reservation in it holds a
// live lease; its ids are new again, those of the epochs kept stay known.
func TestDropExpiredEpochs(t *testing.T) {
	t.Parallel()
	b := setup(t, pgtest.Options{}, processed.Config{Lease: time.Hour})
	ctx := context.Background()
	// Long enough that the claims and epochs below come before it ends on a busy machine
	// (300 ms did not in a CI run beside the epochs' concurrency tests).
	const short = 2 * time.Second
	b.claim(t, processed.Claim{Scope: "s", MessageID: "x", Fingerprint: fp, Retention: short})
	b.claim(t, processed.Claim{Scope: "s", MessageID: "x2", Fingerprint: fp, Retention: short})
	b.openEpoch(t) // 1
	b.claim(t, processed.Claim{Scope: "s", MessageID: "y", Fingerprint: fp, Retention: time.Hour})
	b.openEpoch(t) // 2
	res := b.claim(t, processed.Claim{Scope: "s", MessageID: "r", Fingerprint: fp, Retention: short, Reserve: true})
	require.Equal(t, processed.Claimed, res.Outcome)
	b.openEpoch(t) // 3: the current one, never dropped
	b.claim(t, processed.Claim{Scope: "s", MessageID: "z", Fingerprint: fp, Retention: short})

	dropped, err := b.store.DropExpiredEpochs(ctx, b.db.Pool)
	require.NoError(t, err)
	require.Empty(t, dropped, "nothing has expired yet")
	time.Sleep(short + 50*time.Millisecond) // expiry is by the database clock

	dropped, err = b.store.DropExpiredEpochs(ctx, b.db.Pool)
	require.NoError(t, err)
	// Epoch 1 holds a record kept an hour, epoch 2 a reservation whose lease is live.
	require.Equal(t, []processed.DroppedEpoch{{Epoch: 0, Records: 2}}, lockedFor(t, dropped))
	require.Equal(t, 0, b.db.Count(t, "pg_class WHERE relname = 'processed_messages_e0' AND relnamespace = $1::regnamespace", b.db.Schema))
	require.Equal(t, "1 2 3", b.db.Text(t, b.db.Q(`SELECT string_agg(epoch::text, ' ' ORDER BY epoch) FROM {schema}.processed_epochs`)))
	require.Equal(t, processed.Claimed, b.claim(t, processed.Claim{Scope: "s", MessageID: "x", Fingerprint: fp}).Outcome)
	require.Equal(t, processed.Duplicate, b.claim(t, processed.Claim{Scope: "s", MessageID: "y", Fingerprint: fp}).Outcome)

	// The row pruner still deletes expired records in every partition.
	n, err := b.store.PruneRecords(ctx, b.db.Pool, 0)
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "z, expired in the current epoch; r's lease is live")
}

// A record taken over after its retention moves to the current epoch, so that its old
// epoch can be dropped without it.
func TestTakeOverMovesRecordToCurrentEpoch(t *testing.T) {
	t.Parallel()
	b := setup(t, pgtest.Options{}, processed.Config{})
	ctx := context.Background()
	b.claim(t, processed.Claim{Scope: "s", MessageID: "x", Fingerprint: fp, Retention: 50 * time.Millisecond})
	b.openEpoch(t)
	time.Sleep(100 * time.Millisecond)
	require.Equal(t, processed.Claimed, b.claim(t, processed.Claim{Scope: "s", MessageID: "x", Fingerprint: []byte("new payload"), Retention: time.Hour}).Outcome)
	require.Equal(t, "1:x", b.db.Text(t, b.db.Q(`SELECT string_agg(epoch || ':' || message_id, ' ') FROM {schema}.processed_messages`)))

	dropped, err := b.store.DropExpiredEpochs(ctx, b.db.Pool)
	require.NoError(t, err)
	require.Equal(t, []processed.DroppedEpoch{{Epoch: 0, Records: 0}}, lockedFor(t, dropped))
	require.Equal(t, processed.Duplicate, b.claim(t, processed.Claim{Scope: "s", MessageID: "x", Fingerprint: []byte("new payload")}).Outcome)
}

// A claim in a REPEATABLE READ transaction fails: its snapshot would date from before the
// epochs' lock, and a claim in a newer epoch could miss its uncommitted row.
func TestClaimRefusesRepeatableRead(t *testing.T) {
	t.Parallel()
	b := setup(t, pgtest.Options{}, processed.Config{})
	ctx := context.Background()
	tx, err := b.db.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // the test's end
	_, err = b.store.ClaimBatchTx(ctx, tx, []processed.Claim{{Scope: "s", MessageID: "a", Fingerprint: fp}})
	require.ErrorContains(t, err, "claims need READ COMMITTED transactions")
}

// Pruning by epochs with mixed retentions: an expired record that its epoch would keep more
// than the epoch's span past its retention is deleted row by row; records of one retention
// within an epoch are left for the epoch's drop, whole.
func TestPruneEpochsDeletesOutlivedRecords(t *testing.T) {
	t.Parallel()
	b := setup(t, pgtest.Options{}, processed.Config{Lease: time.Hour})
	ctx := context.Background()
	const short = 200 * time.Millisecond
	// Epoch 0: an API key kept briefly beside a webhook kept an hour, and a reservation
	// whose lease is live.
	b.claim(t, processed.Claim{Scope: "s", MessageID: "long", Fingerprint: fp, Retention: time.Hour})
	b.claim(t, processed.Claim{Scope: "s", MessageID: "short", Fingerprint: fp, Retention: short})
	b.claim(t, processed.Claim{Scope: "s", MessageID: "leased", Fingerprint: fp, Retention: short, Reserve: true})
	// Epoch 1: one retention. u1 expires before u2 does, but by less than the epoch's span.
	b.openEpoch(t)
	b.claim(t, processed.Claim{Scope: "s", MessageID: "u1", Fingerprint: fp, Retention: 300 * time.Millisecond})
	time.Sleep(150 * time.Millisecond)
	b.claim(t, processed.Claim{Scope: "s", MessageID: "u2", Fingerprint: fp, Retention: 300 * time.Millisecond})
	// Epoch 2, the current one: mixed again.
	b.openEpoch(t)
	b.claim(t, processed.Claim{Scope: "s", MessageID: "cur-long", Fingerprint: fp, Retention: time.Hour})
	b.claim(t, processed.Claim{Scope: "s", MessageID: "cur-short", Fingerprint: fp, Retention: short})
	// u1 has expired, u2 maybe not: the outlived rule keeps both for the epoch's drop.
	time.Sleep(short + 100*time.Millisecond)
	n, err := b.store.PruneOutlived(ctx, b.db.Pool, 0)
	require.NoError(t, err)
	require.Equal(t, int64(2), n, "short and cur-short")
	require.Equal(t, "0:leased 0:long 1:u1 1:u2 2:cur-long", b.db.Text(t, b.db.Q(`SELECT string_agg(epoch || ':' || message_id, ' ' ORDER BY epoch, message_id) FROM {schema}.processed_messages`)))

	// A round: epoch 1 goes whole once u2 has expired; nothing more is outlived.
	time.Sleep(200 * time.Millisecond)
	round, err := b.store.PruneEpochs(ctx, b.db.Pool, time.Hour, 0)
	require.NoError(t, err)
	round.Dropped = lockedFor(t, round.Dropped)
	require.Equal(t, processed.EpochRound{Dropped: []processed.DroppedEpoch{{Epoch: 1, Records: 2}}}, round)
	require.Equal(t, int64(2), round.Records())
	require.Equal(t, "0:leased 0:long 2:cur-long", b.db.Text(t, b.db.Q(`SELECT string_agg(epoch || ':' || message_id, ' ' ORDER BY epoch, message_id) FROM {schema}.processed_messages`)))
	require.Equal(t, processed.Claimed, b.claim(t, processed.Claim{Scope: "s", MessageID: "short", Fingerprint: fp}).Outcome)
	require.Equal(t, processed.Duplicate, b.claim(t, processed.Claim{Scope: "s", MessageID: "long", Fingerprint: fp}).Outcome)
}

// Every replica runs a pruner: several dropping the same expired epochs at once each drop
// an epoch at most once, and none fails because another dropped it first.
func TestConcurrentDropsOfExpiredEpochs(t *testing.T) {
	t.Parallel()
	const pruners = 4
	b := setup(t, pgtest.Options{MaxConns: pruners + 2}, processed.Config{})
	ctx := context.Background()
	for round := range 5 {
		for range 3 {
			b.claim(t, processed.Claim{Scope: "s", MessageID: fmt.Sprint(round, "-", rand.Int()), Fingerprint: fp, Retention: time.Millisecond})
			b.openEpoch(t)
		}
		time.Sleep(5 * time.Millisecond)
		var (
			wg      sync.WaitGroup
			dropped atomic.Int32
		)
		for range pruners {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d, err := b.store.DropExpiredEpochs(ctx, b.db.Pool)
				if err != nil {
					t.Errorf("round %d: %v", round, err)
				}
				_, err = b.store.PruneOutlived(ctx, b.db.Pool, 0)
				if err != nil {
					t.Errorf("round %d: %v", round, err)
				}
				dropped.Add(int32(len(d)))
			}()
		}
		wg.Wait()
		require.Equal(t, int32(3), dropped.Load(), "round %d: each expired epoch dropped once", round)
		require.Equal(t, 1, b.db.Count(t, "{schema}.processed_epochs"), "round %d: the current epoch only", round)
	}
}

// lockedFor checks that each dropped epoch says how long processed_messages was locked for
// it, and returns them with that time left out, to be compared.
func lockedFor(t *testing.T, dropped []processed.DroppedEpoch) []processed.DroppedEpoch {
	t.Helper()
	out := make([]processed.DroppedEpoch, len(dropped))
	for i, d := range dropped {
		require.Positive(t, d.Locked, "epoch %d", d.Epoch)
		d.Locked = 0
		out[i] = d
	}
	return out
}

// indexScans claims n new ids named after round with store, with a shared scope (a
// subscription's batch) or not (the receiver's), and returns the index scans of each
// epoch's partition that the claim made.
func (b *bundle) indexScans(t *testing.T, store *processed.Store, round string, n int, shared bool) map[string]int {
	t.Helper()
	claims := make([]processed.Claim, n)
	for i := range claims {
		claims[i] = processed.Claim{Scope: "s", MessageID: fmt.Sprintf("%s-%d", round, i), Fingerprint: fp}
		if !shared && i == 0 {
			claims[i].Reserve = true
		}
	}
	const q = `SELECT relname, idx_scan FROM pg_stat_xact_user_tables WHERE schemaname = $1 AND relname LIKE 'processed_messages_e%'`
	out := map[string]int{}
	for name, scans := range b.xactCounts(t, store, claims, processed.Claimed, q) {
		out[name] = int(scans)
	}
	return out
}

// xactCounts claims claims with store in one transaction, requires each outcome to be want,
// and returns how much each count of q (rows of a name and a count, the schema its $1) grew
// over the claim, read in its transaction.
func (b *bundle) xactCounts(t *testing.T, store *processed.Store, claims []processed.Claim, want processed.Outcome, q string) map[string]int64 {
	t.Helper()
	ctx := context.Background()
	read := func(tx pgx.Tx) map[string]int64 {
		rows, err := tx.Query(ctx, q, b.db.Schema)
		require.NoError(t, err)
		out := map[string]int64{}
		var name string
		var n int64
		_, err = pgx.ForEachRow(rows, []any{&name, &n}, func() error { out[name] = n; return nil })
		require.NoError(t, err)
		return out
	}
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	before := read(tx)
	res, err := store.ClaimBatchTx(ctx, tx, claims)
	require.NoError(t, err)
	for _, r := range res {
		require.Equal(t, want, r.Outcome)
	}
	after := read(tx)
	require.NoError(t, tx.Commit(ctx))
	for k := range after {
		after[k] -= before[k]
	}
	return after
}

// A new id's claim probes the older epochs' partitions for it, and only those: with one
// epoch, the current one's primary key is read once per new id, for the insert's conflict
// check, and not a second time for a probe (BENCHMARKS.md, phase 29). With two, the older
// one is probed once per new id.
func TestClaimProbesOnlyOlderEpochs(t *testing.T) {
	t.Parallel()
	b := setup(t, pgtest.Options{}, processed.Config{})
	const n = 40
	for _, shared := range []bool{true, false} {
		got := b.indexScans(t, b.store, fmt.Sprint("one-", shared), n, shared)
		require.Equal(t, map[string]int{"processed_messages_e0": n}, got, "index scans with one epoch (shared %v)", shared)
	}
	b.openEpoch(t)
	for _, shared := range []bool{true, false} {
		got := b.indexScans(t, b.store, fmt.Sprint("two-", shared), n, shared)
		require.Equal(t, map[string]int{"processed_messages_e0": n, "processed_messages_e1": n}, got, "index scans with two epochs (shared %v)", shared)
	}
}

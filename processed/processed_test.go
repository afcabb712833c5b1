package processed_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/processed"
)

type bundle struct {
	db    *pgtest.DB
	store *processed.Store
}

func setup(t *testing.T, opts pgtest.Options, cfg processed.Config) *bundle {
	t.Helper()
	db := pgtest.NewWithOptions(t, opts)
	cfg.Schema = db.Schema
	store, err := processed.New(&cfg)
	require.NoError(t, err)
	return &bundle{db: db, store: store}
}

func (b *bundle) inTx(t *testing.T, fn func(tx pgx.Tx) error) error {
	t.Helper()
	ctx := context.Background()
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// claimTx claims (scope, id) with ClaimTx in a transaction it commits.
func (b *bundle) claimTx(t *testing.T, scope, id string, fingerprint []byte) error {
	t.Helper()
	return b.inTx(t, func(tx pgx.Tx) error {
		_, err := b.store.ClaimTx(context.Background(), tx, scope, id, fingerprint)
		return err
	})
}

var fp = []byte("fingerprint-a")

func TestClaimConcurrentSameID(t *testing.T) {
	t.Parallel()
	const goroutines = 64
	b := setup(t, pgtest.Options{MaxConns: 40}, processed.Config{})
	ctx := context.Background()

	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		outcomes = map[string]int{}
		start    = make(chan struct{})
	)
	for i := 0; i < goroutines; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			err := b.inTx(t, func(tx pgx.Tx) error {
				rec, err := b.store.ClaimTx(ctx, tx, "stripe", "evt_1", fp)
				switch {
				case err == nil:
					// Hold the claim a moment so that the others really wait on it.
					_, err := tx.Exec(ctx, "SELECT pg_sleep(0.05)")
					mu.Lock()
					outcomes["new"]++
					mu.Unlock()
					return err
				case errors.Is(err, processed.ErrDuplicate):
					// A duplicate only ever sees the committed record.
					if rec == nil || rec.State != processed.StateDone {
						return fmt.Errorf("duplicate without a done record: %+v", rec)
					}
					mu.Lock()
					outcomes["duplicate"]++
					mu.Unlock()
					return nil
				default:
					return err
				}
			})
			require.NoError(t, err)
		}()
	}
	close(start)
	wg.Wait()
	require.Equal(t, map[string]int{"new": 1, "duplicate": goroutines - 1}, outcomes)
	require.Equal(t, 1, b.db.Count(t, "{schema}.processed_messages"))
}

func TestClaimRolledBackLeavesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, pgtest.Options{}, processed.Config{})
	ctx := context.Background()
	b.db.Exec(t, b.db.Q("CREATE TABLE {schema}.effects (id text PRIMARY KEY)"))

	boom := errors.New("effect failed")
	err := b.inTx(t, func(tx pgx.Tx) error {
		if _, err := b.store.ClaimTx(ctx, tx, "s", "m1", fp); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, b.db.Q("INSERT INTO {schema}.effects VALUES ('m1')")); err != nil {
			return err
		}
		return boom
	})
	require.ErrorIs(t, err, boom)
	require.Zero(t, b.db.Count(t, "{schema}.processed_messages"))
	require.Zero(t, b.db.Count(t, "{schema}.effects"))

	for i := 0; i < 2; i++ {
		require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
			_, err := b.store.ClaimTx(ctx, tx, "s", "m1", fp)
			if errors.Is(err, processed.ErrDuplicate) {
				return nil
			}
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, b.db.Q("INSERT INTO {schema}.effects VALUES ('m1')"))
			return err
		}))
	}
	require.Equal(t, 1, b.db.Count(t, "{schema}.effects"))
}

func TestClaimConflictRecordedAndCounted(t *testing.T) {
	t.Parallel()
	b := setup(t, pgtest.Options{}, processed.Config{})
	ctx := context.Background()
	require.NoError(t, b.claimTx(t, "s", "m1", fp))
	other := []byte("fingerprint-b")
	for want := int64(1); want <= 3; want++ {
		require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
			res, err := b.store.ClaimBatchTx(ctx, tx, []processed.Claim{{Scope: "s", MessageID: "m1", Fingerprint: other}})
			require.NoError(t, err)
			require.Equal(t, processed.Conflict, res[0].Outcome)
			require.ErrorIs(t, res[0].Err(), processed.ErrConflict)
			require.Equal(t, want, res[0].ConflictCount)
			require.Equal(t, fp, res[0].Record.Fingerprint)
			return nil
		}))
	}
	var count int64
	var stored, incoming []byte
	require.NoError(t, b.db.Pool.QueryRow(ctx, b.db.Q("SELECT count, stored_fingerprint, incoming_fingerprint FROM {schema}.conflicts WHERE scope = 's' AND message_id = 'm1'")).Scan(&count, &stored, &incoming))
	require.Equal(t, int64(3), count)
	require.Equal(t, fp, stored)
	require.Equal(t, other, incoming)
	// The original record is untouched.
	require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
		_, err := b.store.ClaimTx(ctx, tx, "s", "m1", fp)
		require.ErrorIs(t, err, processed.ErrDuplicate)
		return nil
	}))
}

func TestClaimBatch(t *testing.T) {
	t.Parallel()
	b := setup(t, pgtest.Options{}, processed.Config{})
	ctx := context.Background()
	require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
		for _, id := range []string{"kept", "old"} {
			if _, err := b.store.ClaimTx(ctx, tx, "s", id, fp); err != nil {
				return err
			}
		}
		return b.store.CompleteTx(ctx, tx, "s", "old", &processed.Response{Status: 201, Body: []byte(`{"id":1}`), Headers: map[string]string{"Content-Type": "application/json"}})
	}))
	claims := []processed.Claim{
		{Scope: "s", MessageID: "b", Fingerprint: fp},
		{Scope: "s", MessageID: "old", Fingerprint: fp},
		{Scope: "s", MessageID: "a", Fingerprint: fp},
		{Scope: "s", MessageID: "b", Fingerprint: fp},              // repeat of index 0
		{Scope: "s", MessageID: "a", Fingerprint: []byte("other")}, // conflicting repeat of index 2
		{Scope: "other", MessageID: "a", Fingerprint: fp},          // another scope: new
		{Scope: "s", MessageID: "kept", Fingerprint: []byte("x")},  // conflicts with the stored record
		{Scope: "s", MessageID: "kept", Fingerprint: fp},           // the stored payload again: duplicate
	}
	var res []processed.Result
	require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
		var err error
		res, err = b.store.ClaimBatchTx(ctx, tx, claims)
		return err
	}))
	got := make([]processed.Outcome, len(res))
	for i, r := range res {
		got[i] = r.Outcome
	}
	require.Equal(t, []processed.Outcome{
		processed.Claimed, processed.Duplicate, processed.Claimed, processed.Duplicate, processed.Conflict, processed.Claimed,
		processed.Conflict, processed.Duplicate,
	}, got)
	require.Equal(t, 201, res[1].Record.Response.Status)
	require.Equal(t, `{"id":1}`, string(res[1].Record.Response.Body))
	require.Equal(t, "application/json", res[1].Record.Response.Headers["Content-Type"])
	require.Equal(t, 0, res[3].FirstIndex)
	require.Equal(t, 2, res[4].FirstIndex)
	require.Equal(t, 5, b.db.Count(t, "{schema}.processed_messages"))
	require.Equal(t, 1, b.db.Count(t, "{schema}.conflicts WHERE message_id = 'kept'"), "one conflict, not two")
}

// Claims that share their scope and retention, and reserve nothing, go in a statement that
// takes those once; any other batch sends them per claim. Both write the same rows.
func TestClaimSharedOrMixedColumns(t *testing.T) {
	t.Parallel()
	b := setup(t, pgtest.Options{}, processed.Config{Retention: 5 * time.Hour})
	ctx := context.Background()
	type want struct {
		scope     string
		retention time.Duration
	}
	wants := map[string]want{}
	batches := [][]processed.Claim{
		{{Scope: "s", MessageID: "x1"}, {Scope: "s", MessageID: "x2"}},                                                          // shared, the store's retention
		{{Scope: "s", MessageID: "y1"}, {Scope: "t", MessageID: "y2"}},                                                          // scopes differ
		{{Scope: "s", MessageID: "z1", Retention: time.Hour}, {Scope: "s", MessageID: "z2", Retention: 2 * time.Hour}},          // retentions differ
		{{Scope: "s", MessageID: "w1", Retention: 3 * time.Hour}, {Scope: "s", MessageID: "w2", Retention: 3 * time.Hour}},      // shared, their own retention
		{{Scope: "s", MessageID: "v1", Retention: 5 * time.Hour}, {Scope: "s", MessageID: "v2"}, {Scope: "u", MessageID: "v3"}}, // the same retention, said or not
	}
	for _, claims := range batches {
		for i := range claims {
			claims[i].Fingerprint = []byte("fp " + claims[i].MessageID)
			wants[claims[i].MessageID] = want{claims[i].Scope, cmp.Or(claims[i].Retention, 5*time.Hour)}
		}
		require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
			res, err := b.store.ClaimBatchTx(ctx, tx, claims)
			for _, r := range res {
				require.Equal(t, processed.Claimed, r.Outcome)
			}
			return err
		}))
	}
	rows, err := b.db.Pool.Query(ctx, b.db.Q(`SELECT scope, message_id, fingerprint, status, completed_at = received_at,
       expires_at - received_at, lease_until IS NULL AND lease_token IS NULL AND response_status IS NULL
FROM {schema}.processed_messages`))
	require.NoError(t, err)
	defer rows.Close()
	n := 0
	for rows.Next() {
		var (
			scope, id, status string
			fingerprint       []byte
			completed, noRest bool
			retention         time.Duration
		)
		require.NoError(t, rows.Scan(&scope, &id, &fingerprint, &status, &completed, &retention, &noRest))
		w := wants[id]
		require.Equal(t, w.scope, scope, id)
		require.Equal(t, "fp "+id, string(fingerprint), id)
		require.Equal(t, "done", status, id)
		require.True(t, completed, "%s completed when received", id)
		require.Equal(t, w.retention, retention, id)
		require.True(t, noRest, "%s has no lease and no response", id)
		n++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, len(wants), n)
}

func TestRetentionAndPrune(t *testing.T) {
	t.Parallel()
	b := setup(t, pgtest.Options{}, processed.Config{})
	ctx := context.Background()
	claim := func(id string, retention time.Duration) processed.Outcome {
		var res []processed.Result
		require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
			var err error
			res, err = b.store.ClaimBatchTx(ctx, tx, []processed.Claim{{Scope: "s", MessageID: id, Fingerprint: fp, Retention: retention}})
			return err
		}))
		return res[0].Outcome
	}
	for i := 0; i < 25; i++ {
		require.Equal(t, processed.Claimed, claim(fmt.Sprintf("short-%d", i), time.Millisecond))
	}
	require.Equal(t, processed.Claimed, claim("long", time.Hour))
	time.Sleep(5 * time.Millisecond) // retention is measured by the database clock
	// After its retention an id counts as new, even before the pruner ran.
	require.Equal(t, processed.Claimed, claim("short-0", time.Millisecond))
	require.Equal(t, processed.Duplicate, claim("long", time.Hour))

	time.Sleep(5 * time.Millisecond)
	n, err := b.store.Prune(ctx, b.db.Pool, 10) // three bounded batches
	require.NoError(t, err)
	require.Equal(t, int64(25), n)
	require.Equal(t, 1, b.db.Count(t, "{schema}.processed_messages"))
}

func TestReservationLease(t *testing.T) {
	t.Parallel()
	b := setup(t, pgtest.Options{}, processed.Config{Lease: 200 * time.Millisecond})
	ctx := context.Background()
	reserve := func(f []byte) processed.Result {
		var res []processed.Result
		require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
			var err error
			res, err = b.store.ClaimBatchTx(ctx, tx, []processed.Claim{{Scope: "api", MessageID: "k", Fingerprint: f, Reserve: true}})
			return err
		}))
		return res[0]
	}
	first := reserve(fp)
	require.Equal(t, processed.Claimed, first.Outcome)
	// While the lease is live: same payload is in flight, another payload conflicts.
	require.Equal(t, processed.InFlight, reserve(fp).Outcome)
	require.Equal(t, processed.Conflict, reserve([]byte("other")).Outcome)

	// The first owner crashed; after the lease another claimer takes over.
	require.Eventually(t, func() bool { return reserve(fp).Outcome == processed.Claimed }, 5*time.Second, 50*time.Millisecond)
	// The crashed owner comes back: its token no longer holds the reservation, and its
	// completion (the commit point of its effect) fails too.
	err := b.inTx(t, func(tx pgx.Tx) error { return b.store.AcquireTx(ctx, tx, "api", "k", first.LeaseToken) })
	require.ErrorIs(t, err, processed.ErrLeaseLost)
	err = b.inTx(t, func(tx pgx.Tx) error {
		return b.store.CompleteBatchTx(ctx, tx, []processed.Completion{{Scope: "api", MessageID: "k", State: processed.StateDone, LeaseToken: first.LeaseToken}})
	})
	require.ErrorIs(t, err, processed.ErrLeaseLost)
	require.Equal(t, 1, b.db.Count(t, "{schema}.processed_messages WHERE status = 'in_flight'"), "the new owner's reservation is untouched")
}

// TestReservationEffectDoesNotBlockClaimers: while a reservation's effect transaction runs,
// a concurrent claimer is answered at once (in flight), not made to wait for it.
func TestReservationEffectDoesNotBlockClaimers(t *testing.T) {
	t.Parallel()
	b := setup(t, pgtest.Options{}, processed.Config{})
	ctx := context.Background()
	var token [16]byte
	require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
		res, err := b.store.ClaimBatchTx(ctx, tx, []processed.Claim{{Scope: "api", MessageID: "k", Fingerprint: fp, Reserve: true}})
		token = res[0].LeaseToken
		return err
	}))
	effect, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer effect.Rollback(ctx) //nolint:errcheck
	require.NoError(t, b.store.AcquireTx(ctx, effect, "api", "k", token))

	claimCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
		res, err := b.store.ClaimBatchTx(claimCtx, tx, []processed.Claim{{Scope: "api", MessageID: "k", Fingerprint: fp, Reserve: true}})
		if err == nil {
			require.Equal(t, processed.InFlight, res[0].Outcome)
		}
		return err
	}))
	require.NoError(t, b.store.CompleteBatchTx(ctx, effect, []processed.Completion{{Scope: "api", MessageID: "k", State: processed.StateDone, LeaseToken: token}}))
	require.NoError(t, effect.Commit(ctx))
}

// A known id is answered from its stored row without locking it: a duplicate delivery
// neither waits for nor blocks anyone else on that row (the pruner, another claimer).
func TestClaimOfKnownIDTakesNoLock(t *testing.T) {
	t.Parallel()
	b := setup(t, pgtest.Options{}, processed.Config{})
	ctx := context.Background()
	require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
		_, err := b.store.ClaimTx(ctx, tx, "s", "k", fp)
		return err
	}))
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	res, err := b.store.ClaimBatchTx(ctx, tx, []processed.Claim{{Scope: "s", MessageID: "k", Fingerprint: fp}, {Scope: "s", MessageID: "new", Fingerprint: fp}})
	require.NoError(t, err)
	require.Equal(t, processed.Duplicate, res[0].Outcome)
	require.Equal(t, processed.Claimed, res[1].Outcome)

	// While tx is open: the known row is not locked, the new one is (it is tx's).
	lock := func(id string) error {
		return b.inTx(t, func(other pgx.Tx) error {
			_, err := other.Exec(ctx, b.db.Q("SELECT 1 FROM {schema}.processed_messages WHERE scope = 's' AND message_id = $1 FOR UPDATE NOWAIT"), id)
			return err
		})
	}
	require.NoError(t, lock("k"), "a duplicate's claim holds no lock on its row")
	require.NoError(t, tx.Commit(ctx))
}

// TestConcurrentTakeOverOfExpiredID: many claimers of an id whose retention has passed;
// exactly one takes it over, the others see it (duplicate) or are told it is in flight.
// The expired record is in the current epoch (taken over in place) or in an older one
// (moved to the current epoch).
func TestConcurrentTakeOverOfExpiredID(t *testing.T) {
	t.Parallel()
	for _, older := range []bool{false, true} {
		t.Run(fmt.Sprintf("older_epoch=%v", older), func(t *testing.T) {
			t.Parallel()
			testConcurrentTakeOver(t, older)
		})
	}
}

func testConcurrentTakeOver(t *testing.T, older bool) {
	const claimers = 24
	b := setup(t, pgtest.Options{MaxConns: claimers + 2}, processed.Config{})
	ctx := context.Background()
	require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
		_, err := b.store.ClaimBatchTx(ctx, tx, []processed.Claim{{Scope: "s", MessageID: "k", Fingerprint: fp, Retention: time.Millisecond}})
		return err
	}))
	if older {
		_, err := b.store.OpenEpoch(ctx, b.db.Pool, 0)
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		return b.db.Count(t, "{schema}.processed_messages WHERE expires_at <= now()") == 1
	}, 5*time.Second, 5*time.Millisecond)

	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		outcomes = map[processed.Outcome]int{}
		start    = make(chan struct{})
	)
	for i := 0; i < claimers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			var res []processed.Result
			err := b.inTx(t, func(tx pgx.Tx) error {
				var err error
				// Each claims a new id beside it, so that the batch runs every statement.
				res, err = b.store.ClaimBatchTx(ctx, tx, []processed.Claim{
					{Scope: "s", MessageID: "k", Fingerprint: fp},
					{Scope: "s", MessageID: fmt.Sprintf("n-%d", i), Fingerprint: fp},
				})
				return err
			})
			require.NoError(t, err)
			mu.Lock()
			outcomes[res[0].Outcome]++
			mu.Unlock()
		}()
	}
	close(start)
	wg.Wait()
	require.Equal(t, 1, outcomes[processed.Claimed], "outcomes: %v", outcomes)
	require.Equal(t, claimers-1, outcomes[processed.Duplicate]+outcomes[processed.InFlight], "outcomes: %v", outcomes)
	require.Equal(t, 1, b.db.Count(t, "{schema}.processed_messages WHERE message_id = 'k' AND expires_at > now()"))
	require.Equal(t, 1, b.db.Count(t, "{schema}.processed_messages WHERE message_id = 'k'"), "one row per id, in whichever epoch")
	if older {
		require.Equal(t, 1, b.db.Count(t, "{schema}.processed_messages WHERE message_id = 'k' AND epoch = 1"), "moved to the current epoch")
	}
}

// The tables the pruner and the relay delete from are vacuumed after 2 % of their rows are
// dead, not PostgreSQL's default 20 % (migration 0006): pruned records must not stay on
// disk for days on a large table.
func TestDeletedFromTablesVacuumSooner(t *testing.T) {
	t.Parallel()
	b := setup(t, pgtest.Options{}, processed.Config{})
	for _, table := range []string{"processed_messages_e0", "outbox"} {
		require.Equal(t, 1, b.db.Count(t, "pg_class WHERE oid = $1::regclass AND 'autovacuum_vacuum_scale_factor=0.02' = ANY (reloptions)",
			b.db.Schema+"."+table), table)
	}
}

// TestClaimBatchesSharingIDsDoNotDeadlock: batches that share ids, each listing them in its
// own order, claim them in one order (the statements' ORDER BY scope, message_id), both the
// new ids (claimNew, which waits for a concurrent uncommitted claim of the same key) and the
// expired ones taken over (claim, which locks their rows): no two transactions wait for
// each other (SQLSTATE 40P01, deadlock_detected), however they interleave.
func TestClaimBatchesSharingIDsDoNotDeadlock(t *testing.T) {
	t.Parallel()
	const (
		claimers = 8
		rounds   = 12
		ids      = 24
		perBatch = 16
	)
	b := setup(t, pgtest.Options{MaxConns: claimers + 2}, processed.Config{})
	ctx := context.Background()
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := range claimers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			<-start
			for range rounds {
				claims := make([]processed.Claim, 0, perBatch)
				for _, i := range rng.Perm(ids)[:perBatch] {
					// Expired almost at once: the next batch takes each over.
					claims = append(claims, processed.Claim{Scope: "s", MessageID: fmt.Sprintf("evt_%02d", i), Fingerprint: fp, Retention: time.Millisecond})
				}
				err := b.inTx(t, func(tx pgx.Tx) error {
					if _, err := b.store.ClaimBatchTx(ctx, tx, claims); err != nil {
						return err
					}
					// Hold the rows a moment, so that the other batches wait on them.
					_, err := tx.Exec(ctx, "SELECT pg_sleep(0.005)")
					return err
				})
				require.NoError(t, err, "a batch's claims waited on another's that waited on it")
			}
		})
	}
	close(start)
	wg.Wait()
	require.Equal(t, ids, b.db.Count(t, "{schema}.processed_messages"))
}

// ClaimTx's conflict is recorded whatever the caller does with its transaction next: a
// caller that rolls back on ErrConflict, as most code stops at an error, keeps the record
// (SPEC 1.4: conflicts are recorded for investigation).
func TestClaimTxConflictSurvivesRollback(t *testing.T) {
	t.Parallel()
	b := setup(t, pgtest.Options{}, processed.Config{})
	ctx := context.Background()
	require.NoError(t, b.claimTx(t, "s", "m1", fp))
	for range 2 {
		tx, err := b.db.Pool.Begin(ctx)
		require.NoError(t, err)
		rec, err := b.store.ClaimTx(ctx, tx, "s", "m1", []byte("fingerprint-b"))
		require.ErrorIs(t, err, processed.ErrConflict)
		require.Equal(t, fp, rec.Fingerprint)
		require.NoError(t, tx.Rollback(ctx))
	}
	var count int64
	require.NoError(t, b.db.Pool.QueryRow(ctx, b.db.Q("SELECT count FROM {schema}.conflicts WHERE scope = 's' AND message_id = 'm1' AND incoming_fingerprint = 'fingerprint-b'")).Scan(&count))
	require.Equal(t, int64(2), count)

	// Committed instead, it is recorded once, not twice.
	require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
		_, err := b.store.ClaimTx(ctx, tx, "s", "m1", []byte("fingerprint-b"))
		require.ErrorIs(t, err, processed.ErrConflict)
		return nil
	}))
	require.NoError(t, b.db.Pool.QueryRow(ctx, b.db.Q("SELECT count FROM {schema}.conflicts WHERE scope = 's' AND message_id = 'm1' AND incoming_fingerprint = 'fingerprint-b'")).Scan(&count))
	require.Equal(t, int64(3), count)
}

// A claim without a fingerprint is refused with an error that says so, before any SQL.
func TestClaimRequiresFingerprint(t *testing.T) {
	t.Parallel()
	b := setup(t, pgtest.Options{}, processed.Config{})
	ctx := context.Background()
	for _, f := range [][]byte{nil, {}} {
		require.ErrorContains(t, b.claimTx(t, "s", "m1", f), "no fingerprint")
		_, err := processed.ClaimTx(ctx, nil, "s", "m1", f) // before the transaction is used
		require.ErrorContains(t, err, "no fingerprint")
	}
	require.Equal(t, 0, b.db.Count(t, "{schema}.processed_messages"))
}

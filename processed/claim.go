package processed

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemd/idemd/internal/pgarray"
)

// Outcome is the result of one claim.
type Outcome int

const (
	// Claimed: the id is new and this transaction owns it; run the effect.
	Claimed Outcome = iota + 1
	// Duplicate: applied before with the same fingerprint.
	Duplicate
	// Conflict: the id is known with a different fingerprint; recorded (ClaimTx,
	// ClaimBatchTx say where).
	Conflict
	// InFlight: a reservation holds the id and its lease is live.
	InFlight
)

func (o Outcome) String() string {
	switch o {
	case Claimed:
		return "claimed"
	case Duplicate:
		return "duplicate"
	case Conflict:
		return "conflict"
	case InFlight:
		return "in_flight"
	default:
		return "unknown"
	}
}

// Claim asks for one (scope, message id).
type Claim struct {
	Scope       string
	MessageID   string
	Fingerprint []byte
	// Retention overrides the store's retention for this record. Zero means the store's.
	Retention time.Duration
	// Payload is the message's body. It is stored only when the claim conflicts, for
	// investigation: its first MaxConflictPayload bytes, with the conflict. Defaults to none.
	Payload []byte
	// Reserve makes the claim a reservation: it is meant to be committed on its own,
	// before the effect, and protects the id with a lease. Result.LeaseToken then proves
	// ownership to AcquireTx. Another claimer with the same fingerprint sees InFlight
	// until the lease ends, then takes it over.
	Reserve bool
}

// Result is the outcome of one claim.
type Result struct {
	Outcome Outcome
	// Record is the stored row for Duplicate, Conflict and InFlight (nil when a concurrent
	// reservation is not visible).
	Record *Record
	// ConflictCount is how many times this conflicting fingerprint has been seen.
	ConflictCount int64
	// LeaseToken identifies a reservation this claim made.
	LeaseToken uuid.UUID
	// FirstIndex, for an id that appears more than once in one batch, is the index of its
	// first occurrence (which carries the claim); -1 otherwise.
	FirstIndex int
}

// Err maps the outcome to the package's sentinel errors (nil for Claimed).
func (r Result) Err() error {
	switch r.Outcome {
	case Duplicate:
		return ErrDuplicate
	case Conflict:
		return ErrConflict
	case InFlight:
		return ErrInFlight
	default:
		return nil
	}
}

// ClaimTx claims (scope, id) in tx on the default schema. It returns nil when the id is new,
// or ErrDuplicate, ErrConflict or ErrInFlight with the stored record. fingerprint identifies
// the payload (Fingerprint computes idemd's) and is required: an empty one is an error.
//
// ErrConflict means the conflict has been recorded already, in a transaction of its own
// that ClaimTx commits on a short-lived connection opened with the configuration of tx's
// connection: the record stays whether the caller then commits tx or rolls it back, as a
// caller that stops at the error naturally does. Conflicts are rare (a sender reusing an id
// for another payload), so the extra connection is paid for only then; a failure to record
// is returned as an error instead of ErrConflict, never dropped. ClaimBatchTx, which the
// daemon's doors use, records conflicts in the caller's transaction instead.
func ClaimTx(ctx context.Context, tx pgx.Tx, scope, id string, fingerprint []byte) (*Record, error) {
	return Default.ClaimTx(ctx, tx, scope, id, fingerprint)
}

// ClaimTx claims (scope, id) in tx. See the package-level ClaimTx.
func (s *Store) ClaimTx(ctx context.Context, tx pgx.Tx, scope, id string, fingerprint []byte) (*Record, error) {
	claims := []Claim{{Scope: scope, MessageID: id, Fingerprint: fingerprint}}
	_, res, err := s.claimBatch(ctx, tx, nil, claims, nil, false)
	if err != nil {
		return nil, err
	}
	if res[0].Outcome == Conflict {
		if err := s.recordConflictsApart(ctx, tx, claims, res, []int{0}); err != nil {
			return nil, err
		}
	}
	return res[0].Record, res[0].Err()
}

// conflictLockTimeout bounds how long recordConflictsApart waits for a row lock: the
// holder could be the caller's own transaction (a conflict of the same id and payload that
// it recorded itself with ClaimBatchTx and has not committed), which waits on ClaimTx and
// would never let go.
const conflictLockTimeout = "10s"

// recordConflictsApart records the conflicts idx of claims in a transaction of its own, on
// a connection opened for it with the configuration of tx's, so that they survive tx's
// rollback (ClaimTx).
func (s *Store) recordConflictsApart(ctx context.Context, tx pgx.Tx, claims []Claim, results []Result, idx []int) error {
	cfg := tx.Conn().Config()
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["lock_timeout"] = conflictLockTimeout
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("error connecting to record a conflict: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck // nothing left to do on it
	return s.recordConflicts(ctx, conn, claims, results, idx)
}

// ClaimBatchTx claims many ids and returns one Result per claim, in order: in one round
// trip when every id is new, two when some are known, three when a known one has expired
// (or its reservation's lease has ended) and is taken over. An id repeated within the
// batch is claimed by its first occurrence; the later ones are Duplicate (or Conflict) of
// it with FirstIndex set. Every claim needs a fingerprint.
//
// Unlike ClaimTx, it records the conflicts it finds in tx (Result.ConflictCount counts
// them): they are kept only if tx commits, so commit it after a Conflict, as the daemon's
// doors do with the answer they store.
//
// Rows are inserted in (scope, id) order so that two batches sharing ids cannot deadlock
// on each other's claims.
func (s *Store) ClaimBatchTx(ctx context.Context, tx pgx.Tx, claims []Claim) ([]Result, error) {
	_, res, err := s.claimBatch(ctx, tx, nil, claims, nil, true)
	return res, err
}

// ClaimBatchXactTx is ClaimBatchTx that also returns the id of tx's transaction
// (pg_current_xact_id), in the same round trip. A caller whose COMMIT ends without an
// answer (connection lost, timeout) can then ask another connection whether it committed
// (pg_xact_status) instead of guessing.
func (s *Store) ClaimBatchXactTx(ctx context.Context, tx pgx.Tx, claims []Claim) ([]Result, string, error) {
	var xid string
	_, res, err := s.claimBatch(ctx, tx, nil, claims, &xid, true)
	return res, xid, err
}

// Begin is a transaction that a claim begins in its own round trip (ClaimBatchBeginXact):
// Batch was made with pgx.Batch.BeginTx, and may hold more statements that run first,
// their results dropped; it is sent on Conn.
type Begin struct {
	Conn  *pgx.Conn
	Batch *pgx.Batch
}

// ClaimBatchBeginXact is ClaimBatchXactTx in a transaction that it begins in the round
// trip of the claim (pgx.Batch.BeginTx), saving the round trip of BEGIN. It returns the
// transaction, for the caller to go on with, commit or roll back; on error tx may still be
// open (roll it back) or nil.
func (s *Store) ClaimBatchBeginXact(ctx context.Context, b Begin, claims []Claim) (tx pgx.Tx, res []Result, xid string, err error) {
	tx, res, err = s.claimBatch(ctx, nil, &b, claims, &xid, true)
	return tx, res, xid, err
}

// claimColumns are the unnest arrays of the claims of one statement, in (scope, id) order.
type claimColumns struct {
	index []int // claims index of each row
	ids   []string
	fps   [][]byte
	// shared: the claims share their scope and retention and none reserves, the common
	// batch; the statement then takes scope and retention once (queries.claimNewShared),
	// and the arrays below are not built.
	shared   bool
	scope    string
	retainUs int64
	scopes   []string
	states   []string
	retains  pgarray.Int8
	leaseUs  pgarray.Int8
	// pgtype.UUID encodes without a driver.Valuer call per element, and pgarray.UUID
	// without reflection; Valid false is NULL.
	tokens []pgtype.UUID
	// filtered are the arguments of the new claims' statements that spare the lookup in
	// the older epochs (queries.go, filtered): for each row whether the EpochFilter may
	// hold its id, the epoch it was built under and when that epoch opened. All NULL
	// without a filter: every row is looked up. Not set for the takeover's statement.
	filtered []any
}

// filteredArgs are the arguments that spare the older epochs' lookup to the ids of index
// (claims indexes), from set, the EpochFilter's (nil without one), and held: whether it may
// hold each claim's id, by claims index. All NULL without a filter.
func filteredArgs(set *epochSet, held []bool, index []int) []any {
	if set == nil {
		return []any{[]bool(nil), nil, nil}
	}
	maybe := make([]bool, len(index))
	for j, i := range index {
		maybe[j] = held[i]
	}
	return []any{maybe, set.epoch, set.opened}
}

// columns are the arrays of claims[index]: only ids and fingerprints when canShare and
// the claims share the rest (claimColumns.shared).
func (s *Store) columns(claims []Claim, index []int, canShare bool) *claimColumns {
	n := len(index)
	cc := &claimColumns{index: index, ids: make([]string, n), fps: make([][]byte, n), shared: canShare}
	for j, i := range index {
		c := &claims[i]
		cc.ids[j], cc.fps[j] = c.MessageID, c.Fingerprint
		retain := durationOr(c.Retention, s.retention).Microseconds()
		if j == 0 {
			cc.scope, cc.retainUs = c.Scope, retain
		}
		if c.Reserve || c.Scope != cc.scope || retain != cc.retainUs {
			cc.shared = false
		}
	}
	if cc.shared {
		return cc
	}
	cc.scopes, cc.states, cc.retains = make([]string, n), make([]string, n), make(pgarray.Int8, n)
	cc.leaseUs, cc.tokens = make(pgarray.Int8, n), make([]pgtype.UUID, n)
	for j, i := range index {
		c := &claims[i]
		cc.scopes[j] = c.Scope
		// The effect commits in the same transaction as the claim, so the record is
		// written as done: until that commit nobody else can see it anyway. Only a
		// reservation, committed before its effect, is visibly in flight.
		cc.states[j] = string(StateDone)
		if c.Reserve {
			cc.states[j] = string(StateInFlight)
		}
		cc.retains[j] = durationOr(c.Retention, s.retention).Microseconds()
		if c.Reserve {
			cc.tokens[j] = pgtype.UUID{Bytes: uuid.New(), Valid: true}
			cc.leaseUs[j] = s.lease.Microseconds()
		}
	}
	return cc
}

// claimRun is one claimBatch: the claims, and how rows coming back are matched to them.
type claimRun struct {
	claims  []Claim
	results []Result
	// first maps a claim's key (appendKey) to the index of its first occurrence.
	first map[string]int
	buf   []byte
}

// index finds the claim of a row whose first two columns are scope and message id, read
// from the row's raw bytes: no string is allocated per row.
func (r *claimRun) index(rows pgx.Rows) (int, bool) {
	raw := rows.RawValues()
	r.buf = appendKey(r.buf[:0], raw[0], raw[1])
	i, ok := r.first[string(r.buf)]
	return i, ok
}

// claim queues on batch the statement of sql for cc's rows, or of shared when cc's claims
// share their scope and retention (claimColumns.shared), marking the claims whose row it
// returns as Claimed.
func (r *claimRun) claim(batch *pgx.Batch, sql, shared string, cc *claimColumns) {
	var q *pgx.QueuedQuery
	if cc.shared {
		q = batch.Queue(shared, append([]any{cc.scope, pgarray.Text(cc.ids), pgarray.Bytes(cc.fps), cc.retainUs}, cc.filtered...)...)
	} else {
		q = batch.Queue(sql, append([]any{pgarray.Text(cc.scopes), pgarray.Text(cc.ids), pgarray.Bytes(cc.fps), pgarray.Text(cc.states), cc.retains, cc.leaseUs, pgarray.UUID(cc.tokens)}, cc.filtered...)...)
	}
	q.Query(func(rows pgx.Rows) error {
		for rows.Next() {
			if i, ok := r.index(rows); ok {
				r.results[i].Outcome = Claimed
			}
		}
		return rows.Err()
	})
}

// The claim of a batch is lean when its ids are new, which is the common case: one INSERT …
// ON CONFLICT DO NOTHING RETURNING, whose returned rows are the claimed ids. Only the ids
// it did not claim are read back (lookup), and only the rows that may be taken over (their
// retention has passed, or their reservation's lease has ended) are claimed again with the
// ON CONFLICT DO UPDATE … WHERE that takes them over. A known id therefore costs no row
// lock, and a new one no second index probe. Each statement runs in its own snapshot (READ
// COMMITTED): the lookup sees a row that a concurrent claimer committed while the INSERT
// waited for it.
func (s *Store) claimBatch(ctx context.Context, tx pgx.Tx, begin *Begin, claims []Claim, xid *string, recordInTx bool) (pgx.Tx, []Result, error) {
	r := &claimRun{claims: claims, results: make([]Result, len(claims)), first: make(map[string]int, len(claims))}
	results := r.results
	uniq := make([]int, 0, len(claims))
	// held: whether the older epochs may hold each first occurrence's id (EpochFilter).
	set := s.filter.load()
	var held []bool
	if set != nil {
		held = make([]bool, len(claims))
	}
	for i, c := range claims {
		results[i].FirstIndex = -1
		if c.MessageID == "" {
			return nil, nil, fmt.Errorf("processed: claim %d has an empty message id", i)
		}
		if len(c.Fingerprint) == 0 {
			return nil, nil, fmt.Errorf("processed: claim %d (id %q) has no fingerprint: it is required, to tell a duplicate from a conflict (processed.Fingerprint computes idemd's)", i, c.MessageID)
		}
		r.buf = appendKey(r.buf[:0], c.Scope, c.MessageID)
		if j, ok := r.first[string(r.buf)]; ok {
			results[i].FirstIndex = j
			continue
		}
		r.first[string(r.buf)] = i
		uniq = append(uniq, i)
		if set != nil {
			held[i] = set.mayHold(r.buf)
		}
	}
	slices.SortFunc(uniq, func(a, b int) int {
		ca, cb := &claims[a], &claims[b]
		return cmp.Or(strings.Compare(ca.Scope, cb.Scope), strings.Compare(ca.MessageID, cb.MessageID))
	})

	cc := s.columns(claims, uniq, true)
	cc.filtered = filteredArgs(set, held, cc.index)
	batch := &pgx.Batch{}
	if begin != nil {
		batch = begin.Batch
	}
	prelude := batch.Len()
	var isolation string
	batch.Queue(s.sql.epochLock, s.epochKey).QueryRow(func(row pgx.Row) error { return row.Scan(&isolation, nil, nil) })
	r.claim(batch, s.sql.claimNew, s.sql.claimNewShared, cc)
	queueScansRestore(batch)
	if xid != nil {
		batch.Queue(`SELECT pg_current_xact_id()::text`).QueryRow(func(row pgx.Row) error { return row.Scan(xid) })
	}
	if begin == nil {
		pgarray.Reserve(tx.Conn(), batch)
		if err := tx.SendBatch(ctx, batch).Close(); err != nil {
			return tx, nil, fmt.Errorf("error claiming messages: %w", err)
		}
	} else {
		pgarray.Reserve(begin.Conn, batch)
		br := begin.Conn.SendBatch(ctx, batch)
		tx = br.Tx()
		for range prelude {
			if _, err := br.Exec(); err != nil {
				return tx, nil, errors.Join(fmt.Errorf("error beginning the claim's transaction: %w", err), br.Close())
			}
		}
		if err := br.Close(); err != nil {
			return tx, nil, fmt.Errorf("error claiming messages: %w", err)
		}
	}
	if isolation != "read committed" {
		return tx, nil, fmt.Errorf("processed: claims need READ COMMITTED transactions (each statement sees what committed before it), this one is %s", isolation)
	}
	s.setTokens(r, cc)

	known := uniq[:0:0]
	for _, i := range uniq {
		if results[i].Outcome != Claimed {
			known = append(known, i)
		}
	}
	if len(known) > 0 {
		takeover, err := s.lookup(ctx, tx, r, known, set, held)
		if err != nil {
			return tx, nil, err
		}
		if len(takeover) > 0 {
			if err := s.takeOver(ctx, tx, r, takeover); err != nil {
				return tx, nil, err
			}
		}
	}

	var conflicts []int
	for _, i := range known {
		rec := results[i].Record
		switch {
		case results[i].Outcome == Claimed:
			results[i].Record = nil
		case rec == nil:
			// Not claimable and not visible: a reservation committed between our two
			// statements, a row pruned under us, or taken over by another claimer at the
			// same time; either way someone else has it.
			results[i].Outcome = InFlight
		case !bytes.Equal(rec.Fingerprint, claims[i].Fingerprint):
			results[i].Outcome = Conflict
			conflicts = append(conflicts, i)
		case rec.State == StateInFlight:
			results[i].Outcome = InFlight
		default:
			results[i].Outcome = Duplicate
		}
	}
	// Repeats inside the batch follow their first occurrence, and compare with what is
	// stored: the first occurrence's payload when it claimed the id, else the stored record
	// (a repeat of the stored payload after a conflicting first occurrence is a duplicate,
	// not a second conflict).
	for i := range claims {
		j := results[i].FirstIndex
		if j < 0 {
			continue
		}
		ref := claims[j].Fingerprint
		if rec := results[j].Record; results[j].Outcome == Conflict && rec != nil {
			ref = rec.Fingerprint
		}
		switch {
		case !bytes.Equal(claims[i].Fingerprint, ref):
			results[i].Outcome = Conflict
			stored := &Record{Scope: claims[j].Scope, MessageID: claims[j].MessageID, Fingerprint: claims[j].Fingerprint, State: StateInFlight}
			if results[j].Record != nil {
				stored = results[j].Record
			}
			results[i].Record = stored
			conflicts = append(conflicts, i)
		case results[j].Outcome == Claimed:
			results[i].Outcome = Duplicate
		case results[j].Outcome == Conflict: // the stored payload again
			results[i].Outcome, results[i].Record = Duplicate, results[j].Record
			if results[j].Record.State == StateInFlight {
				results[i].Outcome = InFlight
			}
		default:
			results[i].Outcome = results[j].Outcome
			results[i].Record = results[j].Record
		}
	}
	if len(conflicts) > 0 && recordInTx {
		if err := s.recordConflicts(ctx, tx, claims, results, conflicts); err != nil {
			return tx, nil, err
		}
	}
	return tx, results, nil
}

// setTokens gives the reservations of cc that were claimed their lease tokens.
func (s *Store) setTokens(r *claimRun, cc *claimColumns) {
	if cc.shared {
		return // no reservation among them
	}
	for j, i := range cc.index {
		if r.results[i].Outcome == Claimed && cc.tokens[j].Valid {
			r.results[i].LeaseToken = cc.tokens[j].Bytes
		}
	}
}

// lookup reads the stored rows of the known ids (claims indexes, in key order) into their
// results' Record, and returns the ones that may be taken over. set and held are the
// EpochFilter's and whether it may hold each claim's id (claimBatch's): an id it does not
// hold is looked up in the current epoch only.
func (s *Store) lookup(ctx context.Context, tx pgx.Tx, r *claimRun, known []int, set *epochSet, held []bool) ([]int, error) {
	scopes, ids, fps := make([]string, len(known)), make([]string, len(known)), make([][]byte, len(known))
	for j, i := range known {
		c := &r.claims[i]
		scopes[j], ids[j], fps[j] = c.Scope, c.MessageID, c.Fingerprint
	}
	var (
		takeover  []int
		claimable bool
	)
	sc := newRecordScanner(&claimable)
	err := sendByIndex(ctx, tx, func(b *pgx.Batch) {
		b.Queue(s.sql.lookup, append([]any{pgarray.Text(scopes), pgarray.Text(ids), pgarray.Bytes(fps)}, filteredArgs(set, held, known)...)...).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				i, ok := r.index(rows)
				if !ok {
					continue
				}
				rec, err := sc.scan(rows)
				if err != nil {
					return err
				}
				r.results[i].Record = rec
				if claimable {
					takeover = append(takeover, i)
				}
			}
			return rows.Err()
		})
	})
	if err != nil {
		return nil, fmt.Errorf("error claiming messages: %w", err)
	}
	return takeover, nil
}

// takeOver claims the rows of ids whose retention has passed, or whose reservation's lease
// has ended (claims indexes, in key order), with the statement that checks it again under
// the row's lock: a claimer that took one over first wins, and the others see its row.
func (s *Store) takeOver(ctx context.Context, tx pgx.Tx, r *claimRun, takeover []int) error {
	cc := s.columns(r.claims, takeover, false)
	if err := sendByIndex(ctx, tx, func(b *pgx.Batch) { r.claim(b, s.sql.claim, "", cc) }); err != nil {
		return fmt.Errorf("error claiming messages: %w", err)
	}
	s.setTokens(r, cc)
	for _, i := range takeover {
		if r.results[i].Outcome != Claimed {
			// Taken over by someone else between the lookup and now: in flight.
			r.results[i].Record = nil
		}
	}
	return nil
}

// batchSender is a pgx.Tx or a *pgx.Conn.
type batchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// recordConflicts records the conflicts idx of claims on db, and sets their ConflictCount.
func (s *Store) recordConflicts(ctx context.Context, db batchSender, claims []Claim, results []Result, idx []int) error {
	batch := &pgx.Batch{}
	for _, i := range idx {
		c, r := claims[i], &results[i]
		stored := []byte{}
		if r.Record != nil {
			stored = r.Record.Fingerprint
		}
		payload, truncated := conflictPayload(c.Payload)
		batch.Queue(s.sql.conflict, c.Scope, c.MessageID, stored, c.Fingerprint, payload, truncated,
			durationOr(c.Retention, s.retention).Microseconds()).QueryRow(func(row pgx.Row) error {
			return row.Scan(&r.ConflictCount)
		})
	}
	if err := db.SendBatch(ctx, batch).Close(); err != nil {
		return fmt.Errorf("error recording conflicts: %w", err)
	}
	return nil
}

// MaxConflictPayload bounds the payload a conflict keeps: a longer one is cut to this many
// bytes and flagged truncated.
const MaxConflictPayload = 64 << 10

// conflictPayload is what a conflict stores of payload (nil when there is none).
func conflictPayload(payload []byte) ([]byte, bool) {
	if len(payload) > MaxConflictPayload {
		return payload[:MaxConflictPayload], true
	}
	return payload, false
}

// AcquireTx checks, in the effect transaction tx, that the reservation made by a committed
// Claim{Reserve: true} is still this token's; it fails with ErrLeaseLost when another
// claimer took the id over. It takes no lock, so that concurrent claimers are answered
// InFlight (or Conflict) at once instead of waiting for the effect: ownership is enforced
// again, atomically, by the completion (Completion.LeaseToken), which fails if the
// reservation changed hands meanwhile. Whichever of the two writes the row first wins; the
// other sees it.
func (s *Store) AcquireTx(ctx context.Context, tx pgx.Tx, scope, id string, token uuid.UUID) error {
	_, err := s.AcquireXactTx(ctx, tx, scope, id, token)
	return err
}

// AcquireXactTx is AcquireTx that also returns the id of tx's transaction, in the same
// round trip (see ClaimBatchXactTx).
func (s *Store) AcquireXactTx(ctx context.Context, tx pgx.Tx, scope, id string, token uuid.UUID) (string, error) {
	var xid string
	err := sendByIndex(ctx, tx, func(b *pgx.Batch) {
		b.Queue(s.sql.acquire, scope, id, token).QueryRow(func(row pgx.Row) error { return row.Scan(&xid) })
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrLeaseLost
	}
	if err != nil {
		return "", fmt.Errorf("error acquiring reservation: %w", err)
	}
	return xid, nil
}

// ReleaseTx gives a reservation up (its effect could not run and nothing was stored), so a
// retry may claim the id at once instead of waiting for the lease.
func (s *Store) ReleaseTx(ctx context.Context, tx pgx.Tx, scope, id string, token uuid.UUID) error {
	if err := sendByIndex(ctx, tx, func(b *pgx.Batch) { b.Queue(s.sql.release, scope, id, token) }); err != nil {
		return fmt.Errorf("error releasing reservation: %w", err)
	}
	return nil
}

// appendKey appends the map key of (scope, id) to dst: the scope length-prefixed, so that
// no two pairs share a key.
func appendKey[T string | []byte](dst []byte, scope, id T) []byte {
	dst = strconv.AppendInt(dst, int64(len(scope)), 10)
	dst = append(dst, ':')
	dst = append(dst, scope...)
	return append(dst, id...)
}

func durationOr(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// recordScanner reads record rows (recordColumns, then extra) into new Records through
// one list of destinations for all the rows of a statement: built for each row, the list
// and the variables it points at were most of the bytes the lookup of redelivered ids
// allocated (BENCHMARKS.md, phase 40).
type recordScanner struct {
	r       Record
	state   string
	status  *int32
	headers map[string]string
	body    []byte
	dest    []any
}

func newRecordScanner(extra ...any) *recordScanner {
	s := &recordScanner{}
	s.dest = append([]any{&s.r.Scope, &s.r.MessageID, &s.r.Fingerprint, &s.state, &s.status, &s.headers, &s.body,
		&s.r.ReceivedAt, &s.r.CompletedAt, &s.r.ExpiresAt, &s.r.LeaseUntil}, extra...)
	return s
}

// scan reads the current row into a new Record. Every destination is emptied first, so
// that no value of a row depends on the row before's, whatever pgx does with a destination
// that already holds one.
func (s *recordScanner) scan(rows pgx.Rows) (*Record, error) {
	s.r, s.state, s.status, s.headers, s.body = Record{}, "", nil, nil, nil
	if err := rows.Scan(s.dest...); err != nil {
		return nil, err
	}
	r := s.r
	r.State = State(s.state)
	if s.status != nil {
		r.Response = &Response{Status: int(*s.status), Headers: s.headers, Body: s.body}
	}
	return &r, nil
}

// ForgetTx deletes claims that tx made and no longer wants, such as a claim made beside
// another that turned out not to be new: rolled back with the rest of tx, it would have
// left nothing either.
func (s *Store) ForgetTx(ctx context.Context, tx pgx.Tx, claims []Claim) error {
	if len(claims) == 0 {
		return nil
	}
	scopes, ids := make([]string, len(claims)), make([]string, len(claims))
	for i, c := range claims {
		scopes[i], ids[i] = c.Scope, c.MessageID
	}
	if err := sendByIndex(ctx, tx, func(b *pgx.Batch) { b.Queue(s.sql.forget, scopes, ids) }); err != nil {
		return fmt.Errorf("error forgetting claims: %w", err)
	}
	return nil
}

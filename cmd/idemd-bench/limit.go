package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/pgarray"
	"github.com/idemd/idemd/outbox"
	"github.com/idemd/idemd/processed"
)

// The limit is the consumer's database work done as fast as we know how through pgx, on the
// same input (the same records, duplicates included): per new id a dedup row in
// processed_messages with the columns idemd writes, an effect row and an outbox row; a
// duplicate writes nothing. No Kafka, no fingerprinting (precomputed), no conflict
// detection: only the writes.
//
// Methods:
//   - pipelined: one statement per message (a data-modifying CTE: dedup insert, then the
//     effect and outbox inserts only when it inserted), all of a batch sent in one pgx
//     pipeline, one transaction per batch;
//   - unnest: one statement per batch, the same CTE over unnest() arrays;
//   - copy: COPY of the batch into a temporary staging table, then the same CTE over it.
type limitMethod string

const (
	methodPipelined limitMethod = "pipelined"
	methodUnnest    limitMethod = "unnest"
	methodCopy      limitMethod = "copy"
	// methodClaim claims with idemd's own statements (processed.Store.ClaimBatchTx: the
	// claim with ON CONFLICT … DO UPDATE … WHERE and the lookup of every id), then writes
	// the effects and outbox rows of the claimed ids with one unnest statement. Not one of
	// the limit's candidates: the growth section uses it to tell the claim's cost apart.
	methodClaim limitMethod = "idemd claim + unnest"
)

var limitMethods = []limitMethod{methodPipelined, methodUnnest, methodCopy}

// limitConfig is one way of doing the limit's writes.
type limitConfig struct {
	method  limitMethod
	batch   int
	workers int
	// processed names the dedup table (unquoted, in the bench schema); empty means
	// idemd's. The write-amplification runs use a leaner one.
	processed string
	// lean writes only scope, message_id, fingerprint and expires_at into processed.
	lean bool
	// outbox names the outbox table (unquoted, in the bench schema); empty means idemd's.
	outbox string
	// publish runs a relay-like loop beside the writers that deletes new outbox rows
	// ("delete"), moves them to outbox_published ("move", as KeepPublished does), deletes
	// every row up to the newest id ("delete-known", as a relay that knows the ids from
	// its Handoff), or only advances a published watermark to the newest id ("watermark",
	// with the outbox partitioned by id, whose partitions would be dropped whole), as fast
	// as it can; with logical, "decode" reads the events from a logical replication slot.
	publish string
	// logical writes each event as a transactional logical decoding message
	// (pg_logical_emit_message) instead of an outbox row, as a relay reading a logical
	// replication slot (Debezium's outbox, the third option) would have them
	// written. It needs wal_level=logical (logical.go).
	logical bool
}

func (c limitConfig) String() string {
	s := fmt.Sprintf("%s, %d msgs/tx, %d workers", c.method, c.batch, c.workers)
	if c.processed != "" {
		s += ", " + c.processed
	}
	if c.outbox != "" {
		s += ", " + c.outbox
	}
	if c.logical {
		s += ", events as logical messages"
	}
	if c.publish == "decode" {
		s += ", + a slot decoded"
	} else if c.publish != "" {
		s += ", + " + c.publish + " published rows"
	}
	return s
}

// limitInput is the precomputed input of a limit run.
type limitInput struct {
	recs   []record
	fps    [][]byte
	ops    []pgtype.UUID
	unique int
}

func newLimitInput(recs []record, unique int) *limitInput {
	in := &limitInput{recs: recs, unique: unique, fps: make([][]byte, len(recs)), ops: make([]pgtype.UUID, len(recs))}
	for i, r := range recs {
		s := sha256.Sum256(r.body)
		in.fps[i] = s[:]
		in.ops[i] = pgtype.UUID{Bytes: outbox.OperationID("bench", r.id, 0), Valid: true}
	}
	return in
}

const outboxHeaders = `{"content-type":"application/json"}`

// limitSQL is the statement of a method: $1 scope, $2 topic (effects), $3 outbox topic,
// $4 outbox headers, then the message columns.
func (e *env) limitSQL(c limitConfig) string { return limitSQL(e.q(), c) }

// limitSQL is env.limitSQL in the schema q (quoted).
func limitSQL(q string, c limitConfig) string {
	pm := q + "." + cmpOr(c.processed, "processed_messages")
	ob := q + "." + cmpOr(c.outbox, "outbox")
	// The epoch as idemd's claim names it (processed/queries.go): once per statement, not
	// the column's default, a function called per row.
	cols := `(scope, message_id, fingerprint, status, received_at, completed_at, expires_at, epoch)`
	vals := `$1, u.id, u.fp, 'done', now(), now(), now() + interval '7 days', (SELECT max(epoch) FROM ` + q + `.processed_epochs)`
	if c.lean {
		cols, vals = `(scope, message_id, fingerprint, expires_at)`, `$1, u.id, u.fp, now() + interval '7 days'`
	}
	var from string
	switch c.method {
	case methodPipelined:
		from = `(SELECT $5::text, $6::bytea, $7::bytea, $8::int, $9::bigint, $10::uuid)`
	case methodUnnest:
		from = `unnest($5::text[], $6::bytea[], $7::bytea[], $8::int[], $9::bigint[], $10::uuid[])`
	case methodCopy:
		from = `limit_stage`
	case methodClaim:
		return `WITH u (id, payload, part, off, op) AS (
    SELECT * FROM unnest($5::text[], $6::bytea[], $7::int[], $8::bigint[], $9::uuid[])),
eff AS (INSERT INTO ` + q + `.effects (message_id, payload, topic, part, off)
        SELECT u.id, convert_from(u.payload, 'UTF8')::jsonb, $2, u.part, u.off FROM u)
INSERT INTO ` + ob + ` (operation_id, pipeline, causation_id, topic, payload, headers)
SELECT u.op, $1, u.id, $3, u.payload, $4::jsonb FROM u`
	}
	events := `INSERT INTO ` + ob + ` (operation_id, pipeline, causation_id, topic, payload, headers)
SELECT u.op, $1, u.id, $3, u.payload, $4::jsonb FROM u JOIN ins ON ins.message_id = u.id`
	if c.logical {
		// The outbox row's columns, in one message: the operation id, then the text
		// columns, then the payload.
		events = `SELECT count(pg_logical_emit_message(true, '` + logicalPrefix + `',
    uuid_send(u.op) || convert_to($1 || ' ' || u.id || ' ' || $3 || ' ' || $4, 'UTF8') || u.payload))
FROM u JOIN ins ON ins.message_id = u.id`
	}
	return `WITH u (id, fp, payload, part, off, op) AS (SELECT * FROM ` + from + ` AS s),
ins AS (INSERT INTO ` + pm + ` ` + cols + ` SELECT ` + vals + ` FROM u ON CONFLICT DO NOTHING RETURNING message_id),
eff AS (INSERT INTO ` + q + `.effects (message_id, payload, topic, part, off)
        SELECT u.id, convert_from(u.payload, 'UTF8')::jsonb, $2, u.part, u.off FROM u JOIN ins ON ins.message_id = u.id)
` + events
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// limitPool is a pool for the limit's workers; every connection has the COPY staging table.
func (e *env) limitPool(ctx context.Context, workers int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(e.url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(workers)
	cfg.ConnConfig.RuntimeParams["application_name"] = e.limitApp()
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		pgarray.Register(c.TypeMap())
		_, err := c.Exec(ctx, `CREATE TEMP TABLE limit_stage (id text, fp bytea, payload bytea, part int, off bigint, op uuid) ON COMMIT DELETE ROWS`)
		return err
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// limitApp is the application_name of the limit's connections (CPU accounting).
func (e *env) limitApp() string { return "idemd-bench-" + e.runID + "-limit" }

// limitRun is what runLimit measured.
type limitRun struct {
	elapsed time.Duration
	// cpu is the CPU per message of its client (in the IdemdUs field: the limit runs in
	// the bench process) and of the PostgreSQL backends serving it.
	cpu *CPU
	// work is PostgreSQL's work per message (pgwork.go).
	work *PGWork
}

// runLimit does in's writes with c and returns how long they took and what they cost. The
// effects table is emptied first; the other tables keep what they hold (the growth runs
// pre-fill them).
func (e *env) runLimit(ctx context.Context, in *limitInput, c limitConfig) (limitRun, error) {
	q := e.q()
	if _, err := e.pool.Exec(ctx, "TRUNCATE "+q+".effects"); err != nil {
		return limitRun{}, err
	}
	ob := q + "." + cmpOr(c.outbox, "outbox")
	var before int64
	if err := e.pool.QueryRow(ctx, "SELECT coalesce(max(id), 0) FROM "+ob).Scan(&before); err != nil {
		return limitRun{}, err
	}
	pool, err := e.limitPool(ctx, c.workers+1)
	if err != nil {
		return limitRun{}, err
	}
	defer pool.Close()
	sql := e.limitSQL(c)
	// Each worker owns the ids that hash to it, as a Kafka partition would.
	shares := make([][]int, c.workers)
	for i, r := range in.recs {
		w := hashMod(r.id, c.workers)
		shares[w] = append(shares[w], i)
	}
	pubCtx, stopPub := context.WithCancel(ctx)
	defer stopPub()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
		pubDone  = make(chan error, 1)
	)
	var slot *logicalSlot
	decode := func() {
		go func() {
			slot.decodeLoop(pubCtx)
			pubDone <- slot.close(context.WithoutCancel(ctx), e.pool)
		}()
	}
	if c.logical {
		// Without a reader beside ("decode"), the slot is read once the run is timed, to
		// check what it holds.
		if slot, err = e.newLogicalSlot(ctx, pool); err != nil {
			return limitRun{}, err
		}
		if c.publish == "decode" {
			decode()
		}
	} else if c.publish != "" {
		go func() { pubDone <- e.publishLoop(pubCtx, pool, ob, c.publish) }()
	}
	self := selfCPU()
	pg0, _ := e.backendCPU(ctx, e.limitApp())
	work0 := e.pgCountersNow(ctx)
	begin := time.Now()
	for _, share := range shares {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for len(share) > 0 {
				part := share[:min(c.batch, len(share))]
				share = share[len(part):]
				if err := e.limitBatch(ctx, pool, sql, in, part, c); err != nil {
					mu.Lock()
					firstErr = cmpErr(firstErr, err)
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if c.publish == "decode" && firstErr == nil {
		// The writes are done when the slot's reader has decoded them all.
		firstErr = slot.waitDecoded(ctx, in.unique)
	} else if c.publish != "" {
		// The writes are done when the relay-like loop has caught up.
		pendingSQL := "SELECT EXISTS (SELECT 1 FROM " + ob + " WHERE id > $1)"
		if c.publish == "watermark" { // the rows stay, below the watermark
			pendingSQL = "SELECT EXISTS (SELECT 1 FROM " + ob + " WHERE id > greatest($1, (SELECT w FROM " + q + ".outbox_watermark)))"
		}
		for ctx.Err() == nil && firstErr == nil {
			var pending bool
			if err := e.pool.QueryRow(ctx, pendingSQL, before).Scan(&pending); err != nil {
				return limitRun{}, err
			}
			if !pending {
				break
			}
			select {
			case err := <-pubDone: // the loop ended: it will not catch up
				pubDone <- err // for the read below
				firstErr = cmpErr(err, errors.New("the relay-like loop stopped before the writes were published"))
			case <-time.After(2 * time.Millisecond):
			}
		}
	}
	elapsed := time.Since(begin)
	client := selfCPU() - self
	pg1, cpuOK := e.backendCPU(ctx, e.limitApp())
	if slot != nil && c.publish != "decode" {
		decode() // closes the slot once stopped, whether or not the writes all succeeded
		if firstErr == nil {
			firstErr = slot.waitDecoded(ctx, in.unique)
		}
	}
	stopPub()
	if c.publish != "" || slot != nil {
		if err := <-pubDone; err != nil && firstErr == nil {
			firstErr = err
		}
	}
	if firstErr != nil {
		return limitRun{}, firstErr
	}
	pool.Close()
	// With a logical slot read after the run, its decoding is counted here too.
	work := e.pgWorkSince(ctx, work0, e.limitApp(), len(in.recs))
	effects, err := e.count(ctx, "{schema}.effects")
	if err != nil {
		return limitRun{}, err
	}
	var rows int
	if err := e.pool.QueryRow(ctx, "SELECT count(*) FROM "+ob+" WHERE id > $1", before).Scan(&rows); err != nil {
		return limitRun{}, err
	}
	switch {
	case slot != nil:
		rows += int(slot.messages.Load()) // decoded from the slot
	case c.publish != "" && c.publish != "watermark": // a watermark leaves the rows
		rows = in.unique // deleted (or moved) as published
	}
	if effects != in.unique || rows != in.unique {
		return limitRun{}, fmt.Errorf("limit %s wrote %d effects and %d outbox rows (or decoded messages) for %d distinct ids", c, effects, rows, in.unique)
	}
	var cpu *CPU
	if cpuOK {
		var pg time.Duration
		for pid, d := range pg1 {
			pg += d - pg0[pid] // a backend that connected meanwhile started from 0
		}
		n := float64(len(in.recs))
		cpu = &CPU{IdemdUs: float64(client.Microseconds()) / n, PostgresUs: float64(pg.Microseconds()) / n}
	}
	return limitRun{elapsed: elapsed, cpu: cpu, work: work}, nil
}

// limitBatch writes the messages part (indexes into in) in one transaction.
func (e *env) limitBatch(ctx context.Context, pool *pgxpool.Pool, sql string, in *limitInput, part []int, c limitConfig) error {
	const scope, topic, outTopic = "bench", "limit", "bench.ledger"
	// A repeat within the batch would match its first occurrence's dedup row twice in the
	// joins: only first occurrences are sent (idemd does the same).
	if c.method != methodPipelined && c.method != methodClaim {
		seen := make(map[string]bool, len(part))
		uniq := part[:0:0]
		for _, i := range part {
			if !seen[in.recs[i].id] {
				seen[in.recs[i].id] = true
				uniq = append(uniq, i)
			}
		}
		part = uniq
	}
	if c.method != methodClaim {
		// A batch's rows go in key order, as idemd's claim inserts them: the limit should
		// not be the only one of the two that walks the primary key at random (phase 25).
		if c.method == methodPipelined {
			part = slices.Clone(part) // the caller's; the others' is uniq, built above
		}
		slices.SortStableFunc(part, func(a, b int) int { return strings.Compare(in.recs[a].id, in.recs[b].id) })
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		switch c.method {
		case methodPipelined:
			var b pgx.Batch
			for _, i := range part {
				r := &in.recs[i]
				b.Queue(sql, scope, topic, outTopic, outboxHeaders, r.id, in.fps[i], r.body, int32(r.partition), int64(i), in.ops[i])
			}
			return tx.SendBatch(ctx, &b).Close()
		case methodUnnest:
			n := len(part)
			ids, fps, bodies := make([]string, n), make([][]byte, n), make([][]byte, n)
			parts, offs, ops := make([]int32, n), make([]int64, n), make([]pgtype.UUID, n)
			for j, i := range part {
				r := &in.recs[i]
				ids[j], fps[j], bodies[j], parts[j], offs[j], ops[j] = r.id, in.fps[i], r.body, int32(r.partition), int64(i), in.ops[i]
			}
			// The arrays as idemd passes its own (internal/pgarray): no reflection and no
			// allocation per element in pgx's encoding.
			_, err := tx.Exec(ctx, sql, scope, topic, outTopic, outboxHeaders, pgarray.Text(ids), pgarray.Bytes(fps), pgarray.Bytes(bodies), parts, offs, pgarray.UUID(ops))
			return err
		case methodClaim:
			claims := make([]processed.Claim, len(part))
			for j, i := range part {
				claims[j] = processed.Claim{Scope: scope, MessageID: in.recs[i].id, Fingerprint: in.fps[i]}
			}
			results, err := e.claims.ClaimBatchTx(ctx, tx, claims)
			if err != nil {
				return err
			}
			var ids []string
			var bodies [][]byte
			var parts []int32
			var offs []int64
			var ops []pgtype.UUID
			for j, i := range part {
				if results[j].Outcome == processed.Claimed {
					r := &in.recs[i]
					ids, bodies, parts = append(ids, r.id), append(bodies, r.body), append(parts, int32(r.partition))
					offs, ops = append(offs, int64(i)), append(ops, in.ops[i])
				}
			}
			_, err = tx.Exec(ctx, sql, scope, topic, outTopic, outboxHeaders, pgarray.Text(ids), pgarray.Bytes(bodies), parts, offs, pgarray.UUID(ops))
			return err
		default:
			_, err := tx.CopyFrom(ctx, pgx.Identifier{"limit_stage"}, []string{"id", "fp", "payload", "part", "off", "op"},
				pgx.CopyFromSlice(len(part), func(j int) ([]any, error) {
					i := part[j]
					r := &in.recs[i]
					return []any{r.id, in.fps[i], r.body, int32(r.partition), int64(i), in.ops[i]}, nil
				}))
			if err == nil {
				_, err = tx.Exec(ctx, sql, scope, topic, outTopic, outboxHeaders)
			}
			return err
		}
	})
}

// publishLoop deletes outbox rows (or, how "move", moves them to outbox_published) 1,000 at
// a time, in id order, as the relay does after Kafka acknowledged them, until ctx ends.
// The relay knows most of its rows' ids without reading them (its Handoff), so two more
// ways read only the newest id: "delete-known" deletes every row up to it, and
// "watermark" leaves the rows where they are and moves a published watermark (the one row
// of outbox_watermark) up to it instead: what a relay of an outbox partitioned by id would
// write per round, its partitions dropped whole once below the watermark.
func (e *env) publishLoop(ctx context.Context, pool *pgxpool.Pool, table, how string) error {
	sql := `DELETE FROM ` + table + ` WHERE id IN (SELECT id FROM ` + table + ` ORDER BY id LIMIT 1000)`
	switch how {
	case "move":
		sql = outbox.MovePublishedSQL(e.schema, `id IN (SELECT id FROM `+table+` ORDER BY id LIMIT 1000)`)
	case "delete-known", "watermark":
		return e.publishKnownLoop(ctx, pool, table, how)
	}
	for ctx.Err() == nil {
		tag, err := pool.Exec(ctx, sql)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("publish loop: %w", err)
		}
		if tag.RowsAffected() == 0 {
			select {
			case <-ctx.Done():
			case <-time.After(time.Millisecond):
			}
		}
	}
	return nil
}

// publishKnownLoop is publishLoop's "delete-known" and "watermark": each round takes the
// rows up to the newest id once 1,000 new ones are there (or no more came since the last
// look), the same rounds for both, so that only what a round does to its rows differs. The newest id is the table's identity sequence's last value, as the
// relay knows its handed rows' ids without reading the outbox: a look at the outbox's
// newest row every millisecond, where the writers insert, cost as much as a round.
func (e *env) publishKnownLoop(ctx context.Context, pool *pgxpool.Pool, table, how string) error {
	round := `DELETE FROM ` + table + ` WHERE id <= $1`
	if how == "watermark" {
		round = `UPDATE ` + e.q() + `.outbox_watermark SET w = $1`
	}
	var seq string
	if err := pool.QueryRow(ctx, `SELECT pg_get_serial_sequence($1, 'id')`, table).Scan(&seq); err != nil {
		return fmt.Errorf("publish loop: %w", err)
	}
	var done, seen int64
	for ctx.Err() == nil {
		var newest int64
		err := pool.QueryRow(ctx, `SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM `+seq).Scan(&newest)
		// A round once 1,000 new ids are there, or when no more came since the last look
		// (the writers between batches, or done): the rows of a transaction that took its
		// ids before the last round and committed after it go then.
		if err == nil && newest > 0 && (newest-done >= 1000 || newest == seen) {
			_, err = pool.Exec(ctx, round, newest)
			done = newest
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("publish loop: %w", err)
		}
		seen = newest
		select {
		case <-ctx.Done():
		case <-time.After(time.Millisecond):
		}
	}
	return nil
}

// limitRecords are the limit's input: the consumer's records (same ids, duplicates and
// bodies), so that both do the same writes.
func (e *env) limitRecords() *limitInput {
	recs, unique := records("limit", e.o.messages, e.o.partitions)
	return newLimitInput(recs, unique)
}

// benchLimit measures every method at every batch size with -partitions workers, then the
// best of them with other worker counts; the fastest of all is the limit.
func benchLimit(ctx context.Context, e *env, res *Results) error {
	in := e.limitRecords()
	try := func(c limitConfig) (*Row, error) {
		in := in
		if c.batch == 1 {
			in = newLimitInput(records("limit-one", e.o.messagesOne, e.o.partitions))
		}
		if err := e.truncate(ctx); err != nil {
			return nil, err
		}
		run, err := e.runLimit(ctx, in, c)
		if err != nil {
			return nil, err
		}
		rate := float64(len(in.recs)) / run.elapsed.Seconds()
		e.logf("limit %s: %d msgs in %s: %.0f msgs/s, CPU µs/msg client / pg %s", c, len(in.recs), run.elapsed.Round(time.Millisecond), rate, run.cpu)
		return &Row{Section: "limit", Mode: c.String(), Count: len(in.recs), Seconds: run.elapsed.Seconds(), Rate: rate, Unit: "msgs/s", config: c,
			CPU: run.cpu, Work: run.work}, nil
	}
	var rows []*Row
	for _, m := range limitMethods {
		for _, b := range e.o.limitBatches {
			r, err := try(limitConfig{method: m, batch: b, workers: e.o.partitions})
			if err != nil {
				return err
			}
			rows = append(rows, r)
		}
	}
	best := slices.MaxFunc(rows, func(a, b *Row) int { return cmpFloat(a.Rate, b.Rate) })
	for _, w := range e.o.limitWorkers {
		if w == e.o.partitions {
			continue
		}
		c := best.config
		c.workers = w
		r, err := try(c)
		if err != nil {
			return err
		}
		rows = append(rows, r)
	}
	best = slices.MaxFunc(rows, func(a, b *Row) int { return cmpFloat(a.Rate, b.Rate) })
	one, err := try(limitConfig{method: methodPipelined, batch: 1, workers: e.o.partitions})
	if err != nil {
		return err
	}
	res.LimitOne = one
	res.Limit = best
	var others []string
	for _, r := range rows {
		if r != best {
			others = append(others, fmt.Sprintf("%s %.0f", r.Mode, r.Rate))
		}
	}
	best.Note = "best of: " + strings.Join(others, "; ")
	res.LimitAll = rows
	return nil
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

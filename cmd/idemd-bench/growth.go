package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idemd/idemd/outbox"
)

// prefill fills processed_messages with rows rows of the consumer's scope, ids spread over
// the key space ("evt_" and 32 hex digits, as the bench's ids), retention spread over 7
// days, none expired. The rows go to -growth-epochs epochs by their age, as the daemon's
// default epochs hold them: the newest to the current epoch, the oldest to the oldest, so
// that a new id's claim probes the older epochs' partitions as it would in production
// (since phase 28; before, every row went to the current epoch and a claim probed none).
// The outbox gets rows/2 published rows (the 10 M / 5 M
// proportion) when the relay keeps them (-keep-published; by default it deletes them and
// the outbox holds none), published within the last 12 hours. The dedup rows are inserted
// in the order of their md5 ids, random over the key space, as traffic inserts them: the
// primary key is then as full as traffic leaves it (a pre-fill in key order built it dense,
// and every insert of the measured load split its pages). Then both tables are vacuumed
// and analyzed.
func (e *env) prefill(ctx context.Context, rows int) error {
	if rows == 0 {
		return nil
	}
	q := e.q()
	began := time.Now()
	epochs := e.o.growthEpochs
	for range epochs - 1 {
		if _, err := e.claims.OpenEpoch(ctx, e.pool, 0); err != nil {
			return fmt.Errorf("pre-filling processed_messages: %w", err)
		}
	}
	// A row's age is (g % 7) + 0.5 days, from half a day to six and a half; its epoch is
	// the current one less the share of the seven days its age falls in.
	if _, err := e.pool.Exec(ctx, `INSERT INTO `+q+`.processed_messages
    (scope, message_id, fingerprint, status, received_at, completed_at, expires_at, epoch)
SELECT '`+growthScope+`', 'evt_' || md5('prefill-' || g), sha256(int8send(g)), 'done', t, t, t + interval '7 days',
       (SELECT max(epoch) FROM `+q+`.processed_epochs) - floor(((g % 7) + 0.5) / 7 * $2)::int
FROM (SELECT g, now() - ((g % 7) + 0.5) * interval '1 day' AS t
      FROM generate_series(1, $1::bigint) g) s`, rows, epochs); err != nil {
		return fmt.Errorf("pre-filling processed_messages: %w", err)
	}
	published := 0
	if e.o.keepPublished {
		published = rows / 2
	}
	// Published rows kept are in outbox_published (migration 0008), under the ids the
	// outbox gave them: the outbox's identity then starts after them.
	if _, err := e.pool.Exec(ctx, `INSERT INTO `+q+`.outbox_published
    (id, operation_id, pipeline, causation_id, topic, payload, headers, created_at, published_at)
SELECT g, md5('op-' || g)::uuid, 'bench', 'evt_' || md5('prefill-' || g), 'bench.ledger',
       convert_to('{"id":"evt_' || md5('prefill-' || g) || '","object":"event","type":"payment_intent.succeeded","data":{"object":{"amount":' || g || '}}}', 'UTF8'),
       '{"content-type":"application/json"}', t, t
FROM (SELECT g, now() - (g % 12) * interval '1 hour' AS t
      FROM generate_series(1, $1::bigint) g) s`, published); err != nil {
		return fmt.Errorf("pre-filling the outbox: %w", err)
	}
	if published > 0 {
		if _, err := e.pool.Exec(ctx, `SELECT setval(pg_get_serial_sequence('`+q+`.outbox', 'id'), $1)`, published); err != nil {
			return fmt.Errorf("pre-filling the outbox: %w", err)
		}
	}
	if err := e.vacuum(ctx); err != nil {
		return err
	}
	e.logf("pre-filled %d dedup rows over %d epochs and %d published outbox rows in %s", rows, epochs, published, time.Since(began).Round(time.Millisecond))
	return nil
}

// vacuum vacuums and analyzes the two growing tables (autovacuum may be off on the server:
// the bench does what it would have done).
func (e *env) vacuum(ctx context.Context) error {
	q := e.q()
	_, err := e.pool.Exec(ctx, "VACUUM (ANALYZE) "+q+".processed_messages, "+q+".outbox, "+q+".outbox_published")
	return err
}

// sizes reads the on-disk sizes of processed_messages and the outbox, each index apart;
// processed_messages' are the sums over its partitions (its epochs, migration 0009).
func (e *env) sizes(ctx context.Context, when string) (Sizes, error) {
	s := Sizes{When: when}
	const mib = 1 << 20
	rel := func(name string) string {
		return fmt.Sprintf("pg_relation_size('%s.%s'::regclass)::float8 / %d", e.q(), name, mib)
	}
	// The leaves of a partitioned table or index (itself when it is not partitioned).
	leaves := func(fn, name string) string {
		return fmt.Sprintf("coalesce((SELECT sum(%s(relid)) FROM pg_partition_tree('%s.%s'::regclass) WHERE isleaf), 0)::float8 / %d", fn, e.q(), name, mib)
	}
	err := e.pool.QueryRow(ctx, `SELECT
  p.rows, `+leaves("pg_relation_size", "processed_messages")+`, `+leaves("pg_relation_size", "processed_messages_pkey")+`,
  `+leaves("pg_relation_size", "processed_messages_expires_at_idx")+`, `+leaves("pg_total_relation_size", "processed_messages")+`,
  (SELECT count(*) FROM `+e.q()+`.outbox) + (SELECT count(*) FROM `+e.q()+`.outbox_published), `+rel("outbox")+`, `+rel("outbox_pkey")+`,
  pg_total_relation_size('`+e.q()+`.outbox_published'::regclass)::float8 / `+fmt.Sprint(mib)+`,
  (pg_total_relation_size('`+e.q()+`.outbox'::regclass) + pg_total_relation_size('`+e.q()+`.outbox_published'::regclass))::float8 / `+fmt.Sprint(mib)+`,
  coalesce((SELECT sum(n_dead_tup) FROM pg_stat_user_tables WHERE relid IN (SELECT relid FROM pg_partition_tree('`+e.q()+`.processed_messages'::regclass))), 0)::bigint,
  coalesce((SELECT sum(n_dead_tup) FROM pg_stat_user_tables WHERE schemaname = $1 AND relname IN ('outbox', 'outbox_published')), 0)::bigint,
  p.unexpired, p.held
FROM (SELECT coalesce(sum(n), 0)::bigint AS rows, coalesce(sum(unexpired), 0)::bigint AS unexpired, coalesce(sum(n) FILTER (WHERE unexpired > 0), 0)::bigint AS held
  FROM (SELECT count(*) AS n, count(*) FILTER (WHERE expires_at > now()) AS unexpired FROM `+e.q()+`.processed_messages GROUP BY tableoid) l) p`, e.schema).Scan(
		&s.ProcessedRows, &s.ProcessedHeapMiB, &s.ProcessedPKeyMiB, &s.ProcessedExpMiB, &s.ProcessedTotalMiB,
		&s.OutboxRows, &s.OutboxHeapMiB, &s.OutboxPKeyMiB, &s.OutboxPubMiB, &s.OutboxTotalMiB,
		&s.ProcessedDead, &s.OutboxDead, &s.ProcessedUnexpired, &s.ProcessedEpochsHeld)
	return s, err
}

// bestLimit is the limit's configuration for the growth and amplification runs: the best
// of the limit section when it ran, else unnest at the consumer's batch size.
func (e *env) bestLimit(res *Results) limitConfig {
	if res.Limit != nil {
		return res.Limit.config
	}
	return limitConfig{method: methodUnnest, batch: e.o.batch, workers: e.o.partitions}
}

// growthScope is the scope of the pre-filled dedup rows: the consumer's pipeline, and the
// receivers' source in the growth section.
const growthScope = "bench"

// benchGrowth measures the limit and the consumer (relay running), then the receiver and
// the naive receiver, on tables pre-filled to each -growth-rows size.
//
// At each size the limit's strongest form is chosen first (the faster of two runs of each
// form tried); then -growth-rounds rounds each run that limit and the consumer once, back to
// back on fresh ids, the order alternating from round to round, and the point's ratio is the
// median of the rounds' consumer/limit (since phase 34: the fastest runs of each side,
// minutes apart, moved the growth goal between 0.67 and 1.34 over phases 29 to 33, and to
// 0.73 and 1.23 in two runs of one build). At 0 rows the tables are emptied before every
// run, so that each run of the empty point starts on empty tables, as its name says (until
// phase 34 the point's consumer found the limit's runs' rows, 480,000 of them); at a
// pre-filled size they keep the runs' rows, as traffic would leave them.
func benchGrowth(ctx context.Context, e *env, res *Results) error {
	lc := e.bestLimit(res)
	sizes := e.o.growthRows
	if slices.Contains(sizes, 0) && slices.Max(sizes) > 0 {
		// The empty tables are measured again right after the largest size (TRUNCATE is
		// instant, a pre-fill is not): on a shared machine the load changes more in the
		// minutes a large pre-fill takes than the tables do.
		sizes = append(slices.Clone(sizes), 0)
	}
	for i, rows := range sizes {
		if err := e.truncate(ctx); err != nil {
			return err
		}
		if err := e.prefill(ctx, rows); err != nil {
			return err
		}
		size := sizeLabel(rows, slices.Contains(sizes[:i], rows))
		// fresh readies the tables for the next run: empties them at 0 rows; elsewhere
		// publishes the limit's outbox rows as the relay would have (deletes them, or moves
		// them), so that the consumer's relay has only its own to publish, and leaves the
		// dedup rows in place (the tables keep growing, as they would).
		fresh := func() error {
			if rows == 0 {
				return e.truncate(ctx)
			}
			return e.publishAll(ctx)
		}
		limit, err := e.growthLimit(ctx, fmt.Sprintf("evt-%s-growth-limit-%d", e.runID, i), size, lc, fresh)
		if err != nil {
			return err
		}
		// The limit section chose lc's workers on empty tables; on large ones fewer may be
		// faster (phase 25: at 10 M rows 8 workers ran at 23,410 msgs/s, and idemd's own
		// claim with 4 at 34,507). The limit at each size is the fastest of lc, lc with the
		// consumer's partitions as its workers, and the same writes with idemd's claim
		// statements (each on fresh ids), so that no growth point is held to a weaker one.
		tried := []*Row{limit}
		if lc.workers != e.o.partitions {
			alt := lc
			alt.workers = e.o.partitions
			r, err := e.growthLimit(ctx, fmt.Sprintf("evt-%s-growth-limit-w-%d", e.runID, i), size, alt, fresh)
			if err != nil {
				return err
			}
			tried = append(tried, r)
		}
		cc := limitConfig{method: methodClaim, batch: e.o.batch, workers: e.o.partitions}
		claim, err := e.growthLimit(ctx, fmt.Sprintf("evt-%s-growth-claim-%d", e.runID, i), size, cc, fresh)
		if err != nil {
			return err
		}
		tried = append(tried, claim)
		limit = strongest(tried)
		if rows > 0 {
			// Once, after the limit's runs, as autovacuum would: the statistics of the
			// grown tables.
			if err := e.vacuum(ctx); err != nil {
				return err
			}
		}
		con, rounds, err := e.growthRounds(ctx, size, i, limit.config, fresh)
		if err != nil {
			return err
		}
		if err := fresh(); err != nil {
			return err
		}
		// The receiver and the naive receiver in turns, as in the receiver section, on the
		// same tables: their source is the pre-fill's scope and their ids are spread over
		// the key space, so that their rows land among the pre-filled ones.
		rcv, naive, err := e.receiverTurns(ctx, growthScope, fmt.Sprintf("at %s rows: ", size), true)
		if err != nil {
			return err
		}
		rcv.Section, naive.Section = "growth", "growth"
		res.Growth = append(res.Growth, GrowthPoint{Rows: rows, Limit: limit, LimitClaim: claim, Consumer: con, Rounds: rounds, Receiver: rcv, Naive: naive})
	}
	return nil
}

// publishAll publishes every outbox row as the relay would have: deletes them, or moves
// them to outbox_published with -keep-published; then vacuums the outbox, and its
// connection reports its counters at once (reportCounters), before the next run.
func (e *env) publishAll(ctx context.Context) error {
	publish := "DELETE FROM " + e.q() + ".outbox"
	if e.o.keepPublished {
		publish = outbox.MovePublishedSQL(e.schema, "true")
	}
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, publish); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "VACUUM "+e.q()+".outbox"); err != nil {
		return err
	}
	return reportCounters(ctx, conn)
}

// growthRounds runs -growth-rounds rounds at a growth point, each the limit c and the
// consumer (relay running) on fresh ids, back to back, the limit first in even rounds and
// the consumer first in odd ones, fresh before each run. It returns the fastest of the
// consumer's runs and every round's rates.
func (e *env) growthRounds(ctx context.Context, size string, point int, c limitConfig, fresh func() error) (*Row, []GrowthRound, error) {
	var (
		best   *Row
		rounds []GrowthRound
	)
	for k := range e.o.growthRounds {
		var round GrowthRound
		limit := func() error {
			if err := fresh(); err != nil {
				return err
			}
			recs, unique := records(fmt.Sprintf("evt-%s-growth-round-%d-%d", e.runID, point, k), e.o.growthMessages, e.o.partitions)
			lr, err := e.runLimit(ctx, newLimitInput(recs, unique), c)
			if err != nil {
				return err
			}
			round.Limit = float64(len(recs)) / lr.elapsed.Seconds()
			return nil
		}
		consumer := func() error {
			if err := fresh(); err != nil {
				return err
			}
			con, err := e.runConsumer(ctx, consumerRun{
				name: fmt.Sprintf("consumer at %s rows, BatchSize %d, relay running", size, e.o.batch),
				n:    e.o.growthMessages, batch: e.o.batch, partitions: e.o.partitions, relay: true,
			})
			if err != nil {
				return err
			}
			round.Consumer = con.Rate
			if best == nil || con.Rate > best.Rate {
				best = con
			}
			return nil
		}
		order := []func() error{limit, consumer}
		if k%2 == 1 {
			order = []func() error{consumer, limit}
		}
		for _, run := range order {
			if err := run(); err != nil {
				return nil, nil, err
			}
		}
		e.logf("growth at %s rows, round %d of %d: limit (%s) %.0f msgs/s, consumer %.0f msgs/s: %.3f",
			size, k+1, e.o.growthRounds, c, round.Limit, round.Consumer, round.Consumer/round.Limit)
		rounds = append(rounds, round)
	}
	best.Section = "growth"
	best.Note = fmt.Sprintf("fastest of %d rounds on fresh ids; %s", len(rounds), best.Note)
	return best, rounds, nil
}

// strongest returns a copy of the fastest of rows, its note naming the others.
func strongest(rows []*Row) *Row {
	best := *slices.MaxFunc(rows, func(a, b *Row) int { return cmpFloat(a.Rate, b.Rate) })
	if len(rows) > 1 {
		var others []string
		for _, r := range rows {
			if r.config != best.config {
				others = append(others, fmt.Sprintf("%s %.0f", r.config, r.Rate))
			}
		}
		best.Note += "; the fastest at this size of it and " + strings.Join(others, ", ")
	}
	return &best
}

// sizeLabel names a growth point's table size, "(again)" when an earlier point had it.
func sizeLabel(rows int, again bool) string {
	if again {
		return human(rows) + " (again)"
	}
	return human(rows)
}

// growthLimit runs the limit c twice at a growth point, each time on fresh ids (prefix),
// and keeps the faster run: the baseline at its strongest, and steadier than one load of
// two seconds on a shared machine (at 03:52 on 2 December one such load at 0 rows made the
// limit 13 % faster at 1 M rows than at 0).
func (e *env) growthLimit(ctx context.Context, prefix, size string, c limitConfig, fresh func() error) (*Row, error) {
	return fasterOfTwo(func(run int) (*Row, error) {
		if err := fresh(); err != nil {
			return nil, err
		}
		recs, unique := records(fmt.Sprintf("%s-%d", prefix, run), e.o.growthMessages, e.o.partitions)
		lr, err := e.runLimit(ctx, newLimitInput(recs, unique), c)
		if err != nil {
			return nil, err
		}
		rate := float64(len(recs)) / lr.elapsed.Seconds()
		e.logf("limit at %s rows: %s, run %d: %.0f msgs/s", size, c, run+1, rate)
		return &Row{Section: "growth", Mode: fmt.Sprintf("limit at %s rows: %s", size, c), Count: len(recs), Seconds: lr.elapsed.Seconds(),
			Rate: rate, Unit: "msgs/s", config: c, CPU: lr.cpu, Work: lr.work, Note: "faster of two runs on fresh ids"}, nil
	})
}

// fasterOfTwo runs measure twice (run 0, then 1) and keeps the faster row.
func fasterOfTwo(measure func(run int) (*Row, error)) (*Row, error) {
	var best *Row
	for run := range 2 {
		r, err := measure(run)
		if err != nil {
			return nil, err
		}
		if best == nil || r.Rate > best.Rate {
			best = r
		}
	}
	return best, nil
}

// benchAmplification measures what idemd's table layout costs PostgreSQL: the limit on
// idemd's tables, with the relay's deletes at publish running beside it (what the relay
// does to every row), with the move of published rows to outbox_published instead (with
// -keep-published), and on a lean processed row (scope, id, fingerprint and expiry,
// without the expires_at index), which lives in the bench schema only; idemd's schema is
// not changed. Until phase 17 the outbox had partial indexes that a lean outbox left out;
// since migration 0008 idemd's outbox is that lean outbox. Since phase 29 also, in rounds of
// the newest rows as a relay takes its handed rows: their deletes; an outbox partitioned by
// id (outbox_parted, in the bench schema only: the rows of the run in one partition, an
// older one empty, as the partitions of an outbox whose old ones are dropped whole) with a
// published watermark moved over them instead, what the relay would cost PostgreSQL if
// published rows left with their partition; and that outbox with nothing beside
// (BENCHMARKS.md, phase 29).
func benchAmplification(ctx context.Context, e *env, res *Results) error {
	q := e.q()
	if _, err := e.pool.Exec(ctx, `
CREATE TABLE IF NOT EXISTS `+q+`.processed_lean (
    scope text NOT NULL, message_id text NOT NULL, fingerprint bytea NOT NULL, expires_at timestamptz NOT NULL,
    PRIMARY KEY (scope, message_id));
CREATE TABLE IF NOT EXISTS `+q+`.outbox_parted (
    id bigint GENERATED ALWAYS AS IDENTITY, operation_id uuid NOT NULL, pipeline text NOT NULL,
    causation_id text NOT NULL, topic text NOT NULL, key bytea, payload bytea NOT NULL,
    headers jsonb NOT NULL DEFAULT '{}', created_at timestamptz NOT NULL DEFAULT now(), published_at timestamptz,
    PRIMARY KEY (id)) PARTITION BY RANGE (id);
CREATE TABLE IF NOT EXISTS `+q+`.outbox_parted_p0 PARTITION OF `+q+`.outbox_parted FOR VALUES FROM (MINVALUE) TO (1);
CREATE TABLE IF NOT EXISTS `+q+`.outbox_parted_p1 PARTITION OF `+q+`.outbox_parted FOR VALUES FROM (1) TO (MAXVALUE);
CREATE TABLE IF NOT EXISTS `+q+`.outbox_watermark (w bigint NOT NULL)`); err != nil {
		return err
	}
	in := e.limitRecords()
	base := e.bestLimit(res)
	type variant struct {
		what string
		c    limitConfig
	}
	variants := []variant{
		{"idemd's tables", base},
		{"idemd's tables, relay's DELETE at publish beside", with(base, func(c *limitConfig) { c.publish = "delete" })},
		{"idemd's tables, move to outbox_published beside (keep published)", with(base, func(c *limitConfig) { c.publish = "move" })},
		{"lean processed row, idemd's outbox", with(base, func(c *limitConfig) { c.processed, c.lean = "processed_lean", true })},
		{"lean processed row, idemd's outbox, DELETE at publish beside", with(base, func(c *limitConfig) {
			c.processed, c.lean, c.publish = "processed_lean", true, "delete"
		})},
		{"idemd's tables, DELETE of the rows up to the newest id beside (ids known, as handed over)", with(base, func(c *limitConfig) {
			c.publish = "delete-known"
		})},
		{"idemd's tables, the outbox partitioned by id, a published watermark up to the newest id beside (no DELETE)", with(base, func(c *limitConfig) {
			c.outbox, c.publish = "outbox_parted", "watermark"
		})},
		{"idemd's tables, the outbox partitioned by id, nothing beside", with(base, func(c *limitConfig) { c.outbox = "outbox_parted" })},
	}
	level, err := e.walLevel(ctx)
	if err != nil {
		return err
	}
	if level == "logical" {
		variants = append(variants,
			variant{"idemd's tables, events as logical messages, the slot read after the run", with(base, func(c *limitConfig) { c.logical = true })},
			variant{"idemd's tables, events as logical messages, a slot decoded beside", with(base, func(c *limitConfig) { c.logical, c.publish = true, "decode" })})
		res.Notes = append(res.Notes, "amplification: the server runs with wal_level=logical, which every variant's writes log more under; the logical variants write each event with pg_logical_emit_message instead of an outbox row (logical.go)")
	} else {
		res.Notes = append(res.Notes, fmt.Sprintf("amplification: the logical variants (events as logical decoding messages, a slot read beside) need wal_level=logical; this server has %s", level))
	}
	// Two rounds, the variants interleaved; each keeps its faster run (the machine is shared).
	rows := make([]*Row, len(variants))
	for round := range 2 {
		for i, v := range variants {
			if err := e.truncate(ctx); err != nil {
				return err
			}
			if _, err := e.pool.Exec(ctx, "TRUNCATE "+q+".processed_lean, "+q+".outbox_parted, "+q+".outbox_watermark; INSERT INTO "+q+".outbox_watermark VALUES (0)"); err != nil {
				return err
			}
			lr, err := e.runLimit(ctx, in, v.c)
			if err != nil {
				return err
			}
			rate := float64(len(in.recs)) / lr.elapsed.Seconds()
			e.logf("amplification round %d, %s (%s): %.0f msgs/s, CPU µs/msg client / pg %s", round+1, v.what, v.c, rate, lr.cpu)
			if rows[i] == nil || rate > rows[i].Rate {
				rows[i] = &Row{Section: "amplification", Mode: v.what, Count: len(in.recs), Seconds: lr.elapsed.Seconds(),
					Rate: rate, Unit: "msgs/s", config: v.c, CPU: lr.cpu, Work: lr.work, Note: "faster of two interleaved runs; " + v.c.String()}
			}
		}
	}
	res.Amplification = rows
	for _, r := range rows[1:] {
		res.Notes = append(res.Notes, fmt.Sprintf("amplification: %s = %.2f x idemd's tables", r.Mode, r.Rate/rows[0].Rate))
	}
	return nil
}

func with(c limitConfig, f func(*limitConfig)) limitConfig {
	f(&c)
	return c
}

package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemd/idemd/internal/pgerr"
	"github.com/idemd/idemd/internal/proccpu"
)

// The prune section runs the consumer (relay and pruner running, as the daemon runs them)
// at full speed for -prune-periods retention periods of -prune-retention, so that rows
// expire and are pruned all along the run and the live rows level off at the ingest rate
// times the retention: the steady state a long-running daemon reaches, compressed in time.
// The server runs with autovacuum off; the bench does what autovacuum would (see
// autovacuum). Sizes are sampled every half retention period.

// Sizes of the producer's chunks and how far it stays ahead of what has gone all the way
// through: records the group has not committed and outbox rows the relay has not published.
const (
	pruneChunk = 25000
	pruneLead  = 150000
)

// stream produces fresh records (every fifth a repeat of a recent one) to a topic in
// chunks, staying at most pruneLead ahead of the pipeline's end: records not yet committed
// by the group plus outbox rows not yet published by the relay. Counting the outbox makes
// the rate the one the consumer and its relay sustain together, as in production: a
// consumer that outran its relay would only grow the outbox (it did, by 1,500-1,700 rows
// a second over four minutes, when the lead counted the commits alone), and the run would
// be no steady state.
type stream struct {
	e          *env
	topic      string
	group      string
	partitions int
	// trim, when set, deletes the records below the group's commits as the run goes on.
	trim     *trimmer
	stopping atomic.Bool
	done     chan error
	produced atomic.Int64

	mu     sync.Mutex
	counts []int64
	unique int
	// minLead is the smallest lead over the group's commits seen when a chunk was due
	// (0: the consumer had caught up, and waited for records).
	minLead int64
	// maxWaiting is the most outbox rows seen waiting for the relay when a chunk was due.
	maxWaiting int64
}

func (e *env) startStream(ctx context.Context, topic, group string, partitions int, trim *trimmer) *stream {
	s := &stream{e: e, topic: topic, group: group, partitions: partitions, trim: trim, done: make(chan error, 1),
		counts: make([]int64, partitions), minLead: -1}
	go func() { s.done <- s.run(ctx) }()
	return s
}

func (s *stream) run(ctx context.Context) error {
	for i := 0; !s.stopping.Load(); i++ {
		var offs []int64
		for {
			var err error
			offs, err = s.e.committedOffsets(ctx, s.group, s.topic, s.partitions)
			if err != nil {
				return err
			}
			var c int64
			for _, o := range offs {
				c += o
			}
			var waiting int64
			if err := s.e.pool.QueryRow(ctx, "SELECT count(*) FROM "+s.e.q()+".outbox WHERE published_at IS NULL").Scan(&waiting); err != nil {
				return err
			}
			lead := s.produced.Load() - c
			due := lead+waiting < pruneLead
			s.mu.Lock()
			s.maxWaiting = max(s.maxWaiting, waiting)
			if due && i > pruneLead/pruneChunk && (s.minLead < 0 || lead < s.minLead) {
				s.minLead = lead
			}
			s.mu.Unlock()
			if due {
				break
			}
			if s.stopping.Load() {
				return nil
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
		if s.trim != nil {
			// Below its commits the group reads nothing again, not even after a
			// rebalance.
			if err := s.trim.trim(ctx, s.topic, offs); err != nil {
				return err
			}
		}
		recs, unique := recentRepeats(fmt.Sprintf("evt-%s-prune-%d", s.e.runID, i), pruneChunk, s.partitions)
		counts, err := s.e.produce(ctx, s.topic, recs, s.partitions)
		if err != nil {
			return err
		}
		s.mu.Lock()
		for p, n := range counts {
			s.counts[p] += n
		}
		s.unique += unique
		s.mu.Unlock()
		s.produced.Add(int64(len(recs)))
	}
	return nil
}

// recentRepeats returns n messages over partitions, every fifth one a repeat of one of
// the 1,000 messages before it at most (records over blocks of 1,000), and how many
// distinct ids there are. The repeats are that close so that each comes within the
// retention of its first delivery even with a short retention (a second at 1,000 msgs/s):
// a repeat after it would be new again, and applied again, as it should.
func recentRepeats(prefix string, n, partitions int) ([]record, int) {
	out := make([]record, 0, n)
	unique := 0
	for j := 0; len(out) < n; j++ {
		recs, u := records(fmt.Sprintf("%s-%d", prefix, j), min(1000, n-len(out)), partitions)
		out = append(out, recs...)
		unique += u
	}
	return out, unique
}

// stop stops producing after the current chunk and returns the records each partition got,
// the distinct ids produced, the smallest lead seen and the most outbox rows seen waiting.
func (s *stream) stop() ([]int64, int, int64, int64, error) {
	s.stopping.Store(true)
	err := <-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts, s.unique, s.minLead, s.maxWaiting, err
}

// committed is the sum of group's committed offsets on topic (0 before its first commit).
func (e *env) committed(ctx context.Context, group, topic string, partitions int) (int64, error) {
	offs, err := e.committedOffsets(ctx, group, topic, partitions)
	var sum int64
	for _, o := range offs {
		sum += o
	}
	return sum, err
}

// committedOffsets are group's committed offsets on each partition of topic (0 before its
// first commit).
func (e *env) committedOffsets(ctx context.Context, group, topic string, partitions int) ([]int64, error) {
	cl := &kafka.Client{Addr: kafka.TCP(e.brokers...), Timeout: 10 * time.Second}
	parts := make([]int, partitions)
	for i := range parts {
		parts[i] = i
	}
	resp, err := cl.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: parts}})
	if err != nil {
		return nil, fmt.Errorf("fetching the offsets of group %s: %w", group, err)
	}
	offs := make([]int64, partitions)
	for _, p := range resp.Topics[topic] {
		if p.Error == nil && p.CommittedOffset > 0 && p.Partition < partitions {
			offs[p.Partition] = p.CommittedOffset
		}
	}
	return offs, nil
}

// autovacuum does what PostgreSQL's autovacuum would do to idemd's pruned tables (and
// outbox_published, where -keep-published puts the published rows, since phase 17) on a
// server that runs it (this one may not): every naptime, a worker per table (the server
// has autovacuum_max_workers of them, 3 by default) reads the table's dead, inserted and
// modified rows (pg_stat_user_tables) and its reltuples, and VACUUMs it when autovacuum
// would (dead rows above autovacuum_vacuum_threshold + autovacuum_vacuum_scale_factor ×
// reltuples, or inserted rows above the insert threshold), ANALYZEs it when autoanalyze
// would; the thresholds are the table's storage parameters (migration 0006), else the
// server's settings. Each worker sleeps as an autovacuum worker does (cost-based delay and
// limit, the table's own or the server's autovacuum settings), on a clock compressed as
// its naptime is (clock: the server's autovacuum_naptime / naptime), unless
// -prune-vacuum-clock is false.
type autovacuum struct {
	e       *env
	set     map[string]float64
	limit   float64 // autovacuum's cost limit
	delay   float64 // and cost delay, ms
	clock   float64 // how much faster the emulation's clock runs than the server's
	tables  []string
	workers []*avWorker
	active  atomic.Int32
	stop    context.CancelFunc
	wg      sync.WaitGroup

	mu       sync.Mutex
	vacuums  map[string]int
	analyzes map[string]int
	spent    time.Duration
	err      error
}

// avWorker is the connection that vacuums one table, and its backend's CPU at the start.
type avWorker struct {
	table string
	conn  *pgxpool.Conn
	pid   int
	cpu0  time.Duration
}

// avSettings are the server settings autovacuum's decision reads, by name.
var avSettings = []string{"autovacuum_vacuum_threshold", "autovacuum_vacuum_scale_factor",
	"autovacuum_vacuum_insert_threshold", "autovacuum_vacuum_insert_scale_factor",
	"autovacuum_analyze_threshold", "autovacuum_analyze_scale_factor"}

func (e *env) startAutovacuum(ctx context.Context, naptime time.Duration, tables ...string) (*autovacuum, error) {
	a := &autovacuum{e: e, tables: tables, set: map[string]float64{}, vacuums: map[string]int{}, analyzes: map[string]int{}, clock: 1}
	if e.o.pruneVacClock {
		var secs float64
		if err := e.pool.QueryRow(ctx, "SELECT setting::float8 FROM pg_settings WHERE name = 'autovacuum_naptime'").Scan(&secs); err != nil {
			return nil, fmt.Errorf("reading autovacuum_naptime: %w", err)
		}
		a.clock = max(1, secs/naptime.Seconds())
	}
	for _, name := range avSettings {
		var v float64
		if err := e.pool.QueryRow(ctx, "SELECT current_setting($1)::float8", name).Scan(&v); err != nil {
			return nil, fmt.Errorf("reading %s: %w", name, err)
		}
		a.set[name] = v
	}
	// -1: vacuum_cost_limit, vacuum_cost_delay.
	if err := e.pool.QueryRow(ctx, `SELECT CASE current_setting('autovacuum_vacuum_cost_limit') WHEN '-1'
  THEN current_setting('vacuum_cost_limit') ELSE current_setting('autovacuum_vacuum_cost_limit') END::float8,
  (SELECT CASE setting WHEN '-1' THEN (SELECT setting FROM pg_settings WHERE name = 'vacuum_cost_delay') ELSE setting END
   FROM pg_settings WHERE name = 'autovacuum_vacuum_cost_delay')::float8`).Scan(&a.limit, &a.delay); err != nil {
		return nil, err
	}
	for _, t := range tables {
		conn, err := e.pool.Acquire(ctx)
		if err != nil {
			a.release()
			return nil, err
		}
		w := &avWorker{table: t, conn: conn}
		a.workers = append(a.workers, w)
		if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&w.pid); err != nil {
			a.release()
			return nil, err
		}
		w.cpu0, _ = proccpu.Of(w.pid)
	}
	actx, cancel := context.WithCancel(ctx)
	a.stop = cancel
	for _, w := range a.workers {
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			a.run(actx, w, naptime)
		}()
	}
	return a, nil
}

func (a *autovacuum) release() {
	for _, w := range a.workers {
		w.conn.Release()
	}
}

func (a *autovacuum) run(ctx context.Context, w *avWorker, naptime time.Duration) {
	t := time.NewTicker(naptime)
	defer t.Stop()
	for {
		if err := a.check(ctx, w); err != nil {
			if ctx.Err() == nil {
				a.mu.Lock()
				a.err = errors.Join(a.err, err)
				a.mu.Unlock()
			}
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// check vacuums or analyzes w's table when autovacuum would; a partitioned table's
// partitions one by one, as autovacuum does (processed_messages' epochs, migration 0009).
func (a *autovacuum) check(ctx context.Context, w *avWorker) error {
	// pg_partition_tree lists nothing for a table that is not partitioned.
	rows, err := w.conn.Query(ctx, `SELECT relid::regclass::text FROM pg_partition_tree($1::regclass) WHERE isleaf
UNION ALL SELECT $1::regclass::text WHERE NOT EXISTS (SELECT 1 FROM pg_partition_tree($1::regclass))`, a.e.q()+"."+w.table)
	if err != nil {
		return fmt.Errorf("listing the partitions of %s: %w", w.table, err)
	}
	leaves, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("listing the partitions of %s: %w", w.table, err)
	}
	for _, leaf := range leaves {
		if err := a.checkLeaf(ctx, w, leaf); err != nil {
			return err
		}
	}
	return nil
}

// checkLeaf vacuums or analyzes qualified, one of w's table's leaves, when autovacuum
// would. A partition dropped meanwhile is skipped.
func (a *autovacuum) checkLeaf(ctx context.Context, w *avWorker, qualified string) error {
	var (
		reltuples      float64
		dead, ins, mod int64
		opts           []string
	)
	err := w.conn.QueryRow(ctx, `SELECT c.reltuples, s.n_dead_tup, s.n_ins_since_vacuum, s.n_mod_since_analyze, coalesce(c.reloptions, '{}')
FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid WHERE c.oid = to_regclass($1)`, qualified).Scan(&reltuples, &dead, &ins, &mod, &opts)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading the statistics of %s: %w", qualified, err)
	}
	reltuples = max(reltuples, 0) // -1: never vacuumed nor analyzed
	due := func(n int64, what string) bool {
		return float64(n) > a.param(opts, "autovacuum_"+what+"_threshold")+a.param(opts, "autovacuum_"+what+"_scale_factor")*reltuples
	}
	vacuumDue := due(dead, "vacuum") || due(ins, "vacuum_insert")
	anaDue := due(mod, "analyze")
	var stmt string
	switch {
	case vacuumDue && anaDue:
		stmt = "VACUUM (ANALYZE) " + qualified
	case vacuumDue:
		stmt = "VACUUM " + qualified
	case anaDue:
		stmt = "ANALYZE " + qualified
	default:
		return nil
	}
	// An autovacuum worker sleeps its cost delay whenever it has spent its cost limit (a
	// manual VACUUM does not sleep): the table's storage parameters, else the server's
	// settings, and then the limit is shared among the workers vacuuming at that moment
	// (autovacuum rebalances it while they run; here it is set when a VACUUM starts).
	n := a.active.Add(1)
	defer a.active.Add(-1)
	limit, delay := a.limit, a.delay
	ownLimit, ownDelay := a.reloption(opts, "autovacuum_vacuum_cost_limit"), a.reloption(opts, "autovacuum_vacuum_cost_delay")
	if ownLimit > 0 {
		limit = ownLimit
	}
	if ownDelay >= 0 {
		delay = ownDelay
	}
	if ownLimit <= 0 && ownDelay <= 0 {
		limit /= float64(n)
	}
	// The sleeps, on the emulation's clock: a naptime of 1 s for the server's 1 min makes
	// a cost delay of 2 ms one of 33 µs. Left at the server's, a VACUUM would take as long
	// as on a real server while the retention it keeps up with is compressed: the dead rows
	// of a whole retention period waiting for it, where autovacuum keeps them near its
	// scale factor.
	delay /= a.clock
	if _, err := w.conn.Exec(ctx, "SELECT set_config('vacuum_cost_limit', $1, false), set_config('vacuum_cost_delay', $2, false)",
		strconv.Itoa(max(1, int(limit))), strconv.FormatFloat(delay, 'f', -1, 64)+"ms"); err != nil {
		return err
	}
	began := time.Now()
	if _, err := w.conn.Exec(ctx, stmt); err != nil {
		if pgerr.Code(err) == "42P01" { // undefined_table
			return nil // dropped meanwhile
		}
		return fmt.Errorf("%s: %w", stmt, err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.spent += time.Since(began)
	if vacuumDue {
		a.vacuums[w.table]++
	}
	if anaDue {
		a.analyzes[w.table]++
	}
	return nil
}

// param is a storage parameter of a table with storage parameters opts ("name=value"),
// else the server's setting.
func (a *autovacuum) param(opts []string, name string) float64 {
	if v := a.reloption(opts, name); v >= 0 {
		return v
	}
	return a.set[name]
}

// reloption is the storage parameter name of a table with storage parameters opts
// ("name=value"), or -1.
func (a *autovacuum) reloption(opts []string, name string) float64 {
	for _, o := range opts {
		if k, v, ok := strings.Cut(o, "="); ok && k == name {
			if f, err := strconv.ParseFloat(v, 64); err == nil {
				return f
			}
		}
	}
	return -1
}

// counts returns how many times each table was vacuumed so far.
func (a *autovacuum) counts() map[string]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]int, len(a.vacuums))
	for k, v := range a.vacuums {
		out[k] = v
	}
	return out
}

// finish stops the emulation and describes what it did, with the CPU its backends spent.
func (a *autovacuum) finish() (string, time.Duration, error) {
	a.stop()
	a.wg.Wait()
	var cpu time.Duration
	for _, w := range a.workers {
		c, _ := proccpu.Of(w.pid)
		cpu += c - w.cpu0
	}
	a.release()
	a.mu.Lock()
	defer a.mu.Unlock()
	var parts []string
	for _, t := range a.tables {
		parts = append(parts, fmt.Sprintf("%s vacuumed %d times, analyzed %d times", t, a.vacuums[t], a.analyzes[t]))
	}
	return fmt.Sprintf("%s; %s in VACUUM/ANALYZE (the workers' time added up); cost delay %.3g ms (the server's, on a clock %.0f× faster)", strings.Join(parts, ", "),
		a.spent.Round(100*time.Millisecond), a.delay/a.clock, a.clock), cpu, a.err
}

// benchPrune runs the steady state and measures sizes and rates; see the top of this file.
func benchPrune(ctx context.Context, e *env, res *Results) error {
	if err := e.truncate(ctx); err != nil {
		return err
	}
	retention, periods, parts := e.o.pruneRetention, e.o.prunePeriods, e.o.partitions
	topic, err := e.topic(ctx, "prune", parts)
	if err != nil {
		return err
	}
	outTopic, err := e.topic(ctx, "prune-ledger", parts)
	if err != nil {
		return err
	}
	// The broker keeps no more records than the run still needs: the input's below the
	// group's commits and the events the check has read are deleted as the run goes on.
	trim, err := newTrimmer(e.brokers)
	if err != nil {
		return err
	}
	defer trim.close()
	col := e.startCollector(ctx, outTopic, parts, trim)
	defer col.stop()
	group := "bench-" + e.runID + "-prune"
	st := e.startStream(ctx, topic, group, parts, trim)
	stopStream := func() ([]int64, int, int64, int64, error) { return st.stop() }
	defer func() {
		if !st.stopping.Load() {
			_, _, _, _, _ = stopStream()
		}
	}()
	for st.produced.Load() < pruneLead {
		select {
		case err := <-st.done:
			return fmt.Errorf("producing: %w", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	av, err := e.startAutovacuum(ctx, e.o.pruneNaptime, "processed_messages", "outbox", "outbox_published")
	if err != nil {
		return err
	}
	avDone := false
	defer func() {
		if !avDone {
			_, _, _ = av.finish()
		}
	}()
	cfg := childConfig{
		MaxConns: int32(parts + 4), Topic: topic, Group: group, OutboxTopic: outTopic,
		Batch: e.o.batch, InFlight: e.o.inFlight, Relay: true, RelayBatch: e.o.relayBatch, Retention: retention,
		Prune: true, PruneInterval: e.o.pruneInterval, PartitionInterval: e.o.prunePartitions, OutboxRetention: retention,
		ProfileName: "consumer-prune",
	}
	c, err := e.startChild(ctx, "consumer", cfg)
	if err != nil {
		return err
	}
	began := time.Now()
	var lastAt time.Time
	var lastCommitted int64
	snap := func(role string, half int) (Sizes, int64, error) {
		s, err := e.sizes(ctx, "")
		if err != nil {
			return s, 0, err
		}
		now := time.Now()
		n, err := e.committed(ctx, group, topic, parts)
		if err != nil {
			return s, 0, err
		}
		s.At = now.Sub(began).Seconds()
		s.When = fmt.Sprintf("%.0f s", s.At)
		s.Role, s.Half = role, half
		if !lastAt.IsZero() {
			s.Rate = float64(n-lastCommitted) / now.Sub(lastAt).Seconds()
		}
		lastAt, lastCommitted = now, n
		vac := av.counts()
		s.ProcessedVacuums, s.OutboxVacuums = vac["processed_messages"], vac["outbox"]+vac["outbox_published"]
		res.PruneSizes = append(res.PruneSizes, s)
		e.logf("prune %s: %.0f msgs/s, processed %d live %d dead %.1f MiB, outbox %d live %d dead %.1f MiB, vacuums %d / %d",
			s.When, s.Rate, s.ProcessedRows, s.ProcessedDead, s.ProcessedTotalMiB, s.OutboxRows, s.OutboxDead, s.OutboxTotalMiB,
			s.ProcessedVacuums, s.OutboxVacuums)
		return s, n, nil
	}
	if _, _, err := snap("", 0); err != nil {
		c.kill()
		return err
	}
	// Samples every half period. The goal compares the samples of the second half of the
	// run with those of the first, from three periods in (the live rows level off after
	// the first period; the primary key, built by inserts alone in the first, settles to
	// the fill that deletes leave it over the next few). The windows of the goal before
	// phase 7 (the period after the middle, the reference, and the last period) and the
	// third period are kept to show that. The CPU and rate of the steady state count from
	// two periods in.
	half := retention / 2
	var refAt time.Time
	var refCommitted, endCommitted int64
	for i := 1; i <= 2*periods; i++ {
		select {
		case <-ctx.Done():
			c.kill()
			return ctx.Err()
		case <-time.After(time.Until(began.Add(time.Duration(i) * half))):
		}
		role := ""
		switch {
		case i >= 4 && i <= 6:
			role = "third"
		case i >= periods && i <= periods+2:
			role = "reference"
		case i >= 2*periods-2:
			role = "end"
		}
		half := 0
		switch {
		case i > periods:
			half = 2
		case i >= 6:
			half = 1
		}
		_, n, err := snap(role, half)
		if err != nil {
			c.kill()
			return err
		}
		switch i {
		case 4:
			refAt, refCommitted = lastAt, n
			// The CPU of the steady state only.
			e.startCPU(ctx, c, "idemd-bench-"+e.runID+"-consumer")
		case 2 * periods:
			endCommitted = n
		}
	}
	steadyCPU := e.cpuPerMessage(ctx, c, int(endCommitted-refCommitted))
	rss, err := c.stop()
	if err != nil {
		return err
	}
	pruning := "rows"
	if e.o.prunePartitions > 0 {
		pruning = "epochs of " + e.o.prunePartitions.String()
	}
	steady := &Row{Section: "prune", Mode: fmt.Sprintf("consumer, relay and pruner (by %s) running, retention %s, steady state (periods 3-%d)", pruning, retention, periods),
		Count: int(endCommitted - refCommitted), Seconds: lastAt.Sub(refAt).Seconds(), Unit: "msgs/s", PeakRSSMiB: rss, CPU: steadyCPU}
	steady.Rate = float64(steady.Count) / steady.Seconds
	res.PruneSteady = steady
	res.PruneByEpochs = e.o.prunePartitions > 0

	// The same consumer without the pruner, on the tables the steady state left, for half a
	// period: the rate pruning costs, on (nearly) equal tables.
	cfg.Prune = false
	cfg.ProfileName = "consumer-prune-off"
	c, err = e.startChild(ctx, "consumer", cfg)
	if err != nil {
		return err
	}
	before, err := e.committed(ctx, group, topic, parts)
	if err != nil {
		c.kill()
		return err
	}
	var from time.Time
	var fromCommitted int64
	for from.IsZero() {
		n, err := e.committed(ctx, group, topic, parts)
		if err == nil {
			err = ctx.Err()
		}
		if err != nil {
			c.kill()
			return err
		}
		if n > before {
			from, fromCommitted = time.Now(), n
			e.startCPU(ctx, c, "idemd-bench-"+e.runID+"-consumer")
		} else {
			time.Sleep(20 * time.Millisecond)
		}
	}
	time.Sleep(half)
	to := time.Now()
	toCommitted, err := e.committed(ctx, group, topic, parts)
	if err != nil {
		c.kill()
		return err
	}
	offCPU := e.cpuPerMessage(ctx, c, int(toCommitted-fromCommitted))
	if _, _, err := snap("no pruner", 0); err != nil {
		c.kill()
		return err
	}
	off := &Row{Section: "prune", Mode: "consumer, relay running, no pruner, right after on the same tables",
		Count: int(toCommitted - fromCommitted), Seconds: to.Sub(from).Seconds(), Unit: "msgs/s", CPU: offCPU}
	off.Rate = float64(off.Count) / off.Seconds
	res.PruneOff = off

	// Stop producing, let the consumer finish what was produced, and check exactly once.
	counts, unique, minLead, maxWaiting, err := stopStream()
	if err != nil {
		c.kill()
		return fmt.Errorf("producing: %w", err)
	}
	if _, err := e.waitCommitted(ctx, group, topic, counts, 5*time.Minute); err != nil {
		c.kill()
		return err
	}
	var late int
	off.PeakRSSMiB, late, err = e.checkOnceWith(ctx, c, 0, unique, retention, func(ids map[string]bool) error { return col.finish(ctx, ids) })
	if err != nil {
		return err
	}
	var total int64
	for _, n := range counts {
		total += n
	}
	avNote, avCPU, err := av.finish()
	avDone = true
	if err != nil {
		return fmt.Errorf("autovacuum emulation: %w", err)
	}
	lead := fmt.Sprintf("the producer stayed at least %d records ahead of the consumer's commits", minLead)
	if minLead == 0 {
		lead = "the consumer caught up with the producer at times (its rate is then the producer's, held back by the relay's backlog)"
	}
	lead += fmt.Sprintf(", with at most %d outbox rows waiting for the relay (the producer counts them in its lead of %d)", maxWaiting, pruneLead)
	once := "each effect once"
	if late > 0 {
		once = fmt.Sprintf("each effect once except %d repeats that came at least one retention after their id was applied (the pipeline stalled longer than a retention) and were applied again, as retention says", late)
	}
	steady.Note = fmt.Sprintf("%d records (%d distinct ids) produced in chunks of %d while the run went on, %s, and each event in the outbox or on its topic; %s; pruner every %s (the daemon's default is 1 min for 7 days of retention); the autovacuum emulation every %s: %s, %.0f µs of its backends' CPU per message over the whole run (not in the CPU column, which counts from two periods in to the end); the broker's records deleted as the run went on, so that it holds a long run: %d of the input below the group's commits, %d events after the check had read them (the reading in the bench's CPU)",
		total, unique, pruneChunk, once, lead, e.o.pruneInterval, e.o.pruneNaptime, avNote, float64(avCPU.Microseconds())/float64(max(total, 1)),
		trim.deleted(topic), trim.deleted(outTopic))
	res.Notes = append(res.Notes, "prune: sizes in MiB of processed_messages and the outbox, each with its indexes and total (pg_total_relation_size), sampled every half retention period; live rows by count(*), dead rows pg_stat_user_tables.n_dead_tup, epochs held: the live rows of the partitions still holding an unexpired record (with epochs, what the pruner must keep); vacuums: how many VACUUMs the autovacuum emulation ran on each table so far; the goal compares the largest sizes of the run's second half with those of its first half from three periods in (half 2 and 1), per row of the epochs held with epochs (both ways, over the samples where no expired epoch waited for the pruner's next pass when each half has some), per unexpired row if more row by row, see BENCHMARKS.md")
	return nil
}

// pruneWindow is the largest of each size over the samples of a window, and the most
// unexpired dedup rows seen until its end.
type pruneWindow struct {
	total, heap, pkey, exp, outbox float64
	unexpired                      int64
	// held is the most dedup rows the table held in the window, live and dead;
	// epochsHeld the most rows of its epochs that held an unexpired record
	// (Sizes.ProcessedEpochsHeld).
	held, epochsHeld int64
	n                int // samples
	// caught is the window over its samples where no epoch waited for the pruner's next
	// pass (every live row in an epoch that holds an unexpired record; with epochs only),
	// nil when there was none; waiting counts the others.
	caught  *pruneWindow
	waiting int
}

func (w *pruneWindow) add(s Sizes, unexpired int64) {
	w.take(s, unexpired)
	if s.ProcessedEpochsHeld > 0 {
		if s.ProcessedRows > s.ProcessedEpochsHeld {
			w.waiting++
		} else {
			if w.caught == nil {
				w.caught = new(pruneWindow)
			}
			w.caught.take(s, unexpired)
		}
	}
}

// take counts s in the window's sizes and rows.
func (w *pruneWindow) take(s Sizes, unexpired int64) {
	w.total = max(w.total, s.ProcessedTotalMiB+s.OutboxTotalMiB)
	w.heap = max(w.heap, s.ProcessedHeapMiB)
	w.pkey = max(w.pkey, s.ProcessedPKeyMiB)
	w.exp = max(w.exp, s.ProcessedExpMiB)
	w.outbox = max(w.outbox, s.OutboxTotalMiB)
	w.unexpired = unexpired
	w.held = max(w.held, s.ProcessedRows+s.ProcessedDead)
	w.epochsHeld = max(w.epochsHeld, s.ProcessedEpochsHeld)
	w.n++
}

// pruneWindowSet are the steady state's windows: its first and second halves (the goal's),
// and the third period, reference (the period after the middle) and end (last period), the
// windows of the goal before phase 7.
type pruneWindowSet struct {
	first, second, third, ref, end pruneWindow
}

// pruneWindows are the steady state's windows; ok is false when the run has no halves.
func (r *Results) pruneWindows() (w pruneWindowSet, ok bool) {
	var unexpired int64
	for _, s := range r.PruneSizes {
		unexpired = max(unexpired, s.ProcessedUnexpired)
		switch s.Half {
		case 1:
			w.first.add(s, unexpired)
		case 2:
			w.second.add(s, unexpired)
		}
		switch s.Role {
		case "third":
			w.third.add(s, unexpired)
		case "reference":
			w.ref.add(s, unexpired)
		case "end":
			w.end.add(s, unexpired)
		}
	}
	return w, w.first.n > 0 && w.second.n > 0 && w.first.total > 0
}

// The size goal: flat, within what sampling a sawtooth every half period and relations
// growing by extension steps (PostgreSQL adds up to 512 pages at once when writers queue
// for a relation's extension lock) make of a flat size.
const (
	pruneTolerance = 1.02
	pruneGoal      = "<= 1.02 (flat within 2 %)"
)

package main

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/idemd/idemd/consumer"
	"github.com/idemd/idemd/outbox"
)

// record is one pre-produced message: its id, its partition and its body.
type record struct {
	id        string
	partition int
	body      []byte
}

// records returns n messages over partitions, every fifth one a repeat (same id, same
// body, same partition, later offset) of an earlier message, as an at-least-once
// producer would send. It also returns how many distinct ids there are.
func records(prefix string, n, partitions int) ([]record, int) {
	rng := rand.New(rand.NewPCG(1, 2))
	out := make([]record, 0, n)
	var fresh []int
	for i := range n {
		if i%5 == 4 && len(fresh) > 0 {
			out = append(out, out[fresh[rng.IntN(len(fresh))]])
			continue
		}
		id := spreadID(prefix, i)
		out = append(out, record{id: id, partition: hashMod(id, partitions), body: eventBody(id, i)})
		fresh = append(fresh, len(out)-1)
	}
	return out, len(fresh)
}

// spreadID is an event id spread over the key space as real event ids are (random-looking
// after a fixed prefix), so that new ids land all over processed_messages' primary key
// index, among the pre-filled ones of the growth runs ("evt_" and 32 hex digits as well).
func spreadID(prefix string, i int) string {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s-%d", prefix, i)
	return fmt.Sprintf("evt_%016x%016x", h.Sum64(), uint64(i))
}

func eventBody(id string, i int) []byte {
	return fmt.Appendf(nil, `{"id":%q,"object":"event","type":"payment_intent.succeeded","created":%d,"data":{"object":{"id":"pi_%06d","object":"payment_intent","amount":%d,"currency":"eur","customer":"cus_%05d"}}}`,
		id, 1700000000+i, i%50000, 100+i%9000, i%997)
}

// byPartition sends each message to the partition it names.
type byPartition struct{}

func (byPartition) Balance(m kafka.Message, _ ...int) int { return m.Partition }

// produce writes recs to topic and returns how many records each partition got.
func (e *env) produce(ctx context.Context, topic string, recs []record, partitions int) ([]int64, error) {
	w := &kafka.Writer{
		Addr: kafka.TCP(e.brokers...), Topic: topic, Balancer: byPartition{},
		BatchSize: 1000, BatchBytes: 16 << 20, BatchTimeout: 5 * time.Millisecond, RequiredAcks: kafka.RequireOne,
	}
	defer w.Close()
	counts := make([]int64, partitions)
	msgs := make([]kafka.Message, 0, 5000)
	flush := func() error {
		if len(msgs) == 0 {
			return nil
		}
		err := w.WriteMessages(ctx, msgs...)
		msgs = msgs[:0]
		return err
	}
	for _, r := range recs {
		counts[r.partition]++
		msgs = append(msgs, kafka.Message{
			Partition: r.partition, Key: []byte(r.id), Value: r.body,
			Headers: []kafka.Header{{Key: "operation-id", Value: []byte(r.id)}},
		})
		if len(msgs) == cap(msgs) {
			if err := flush(); err != nil {
				return nil, fmt.Errorf("producing to %s: %w", topic, err)
			}
		}
	}
	if err := flush(); err != nil {
		return nil, fmt.Errorf("producing to %s: %w", topic, err)
	}
	return counts, nil
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// benchConsumer consumes pre-produced topics with the consumer in a child process: batched
// with the relay running beside it (as in production: the goal), batched without it, and
// with one transaction per message. Each is timed by the group's committed offsets.
func benchConsumer(ctx context.Context, e *env, res *Results) error {
	for _, mode := range []struct {
		name  string
		n     int
		batch int
		relay bool
		out   **Row
	}{
		{fmt.Sprintf("exactly-once, BatchSize %d, relay running", e.o.batch), e.o.messages, e.o.batch, true, &res.Consumer},
		{fmt.Sprintf("exactly-once, BatchSize %d, no relay", e.o.batch), e.o.messages, e.o.batch, false, &res.ConsumerNoRelay},
		{"exactly-once, BatchSize 1, relay running", e.o.messagesOne, 1, true, &res.ConsumerOne},
	} {
		if err := e.truncate(ctx); err != nil {
			return err
		}
		r, err := e.runConsumer(ctx, consumerRun{name: mode.name, n: mode.n, batch: mode.batch, relay: mode.relay, partitions: e.o.partitions})
		if err != nil {
			return err
		}
		*mode.out = r
		if mode.out == &res.Consumer && res.Limit != nil {
			// On a shared machine the limit measured a minute earlier may have run in a
			// quieter (or busier) moment: it is measured again right after the consumer,
			// and the ratio is taken to the faster of the two.
			again, err := e.limitAgain(ctx, res.Limit.config)
			if err != nil {
				return err
			}
			res.LimitAgain = again
		}
	}
	return benchBare(ctx, e, res)
}

// benchBare measures the bare consumer (bare.go), the ceiling of the consumer's ratio to
// the limit: at the consumer's batch size and at the limit's best when it differs (the
// faster counts), then at that size deleting its published outbox rows, as a relay does.
func benchBare(ctx context.Context, e *env, res *Results) error {
	run := func(batch int, deletes bool) (*Row, error) {
		if err := e.truncate(ctx); err != nil {
			return nil, err
		}
		name := fmt.Sprintf("bare: kafka-go and the limit's unnest, BatchSize %d, events published after commit", batch)
		if deletes {
			name += ", then their outbox rows deleted"
		}
		return e.runConsumer(ctx, consumerRun{name: name, n: e.o.messages, batch: batch, bare: true, bareDelete: deletes, partitions: e.o.partitions})
	}
	best, batch := (*Row)(nil), e.o.batch
	batches := []int{e.o.batch}
	if res.Limit != nil && res.Limit.config.batch != e.o.batch {
		batches = append(batches, res.Limit.config.batch)
	}
	var others []string
	for _, b := range batches {
		r, err := run(b, false)
		if err != nil {
			return err
		}
		switch {
		case best == nil:
			best = r
		case r.Rate > best.Rate:
			others = append(others, fmt.Sprintf("BatchSize %d %.0f msgs/s", batch, best.Rate))
			best, batch = r, b
		default:
			others = append(others, fmt.Sprintf("BatchSize %d %.0f msgs/s", b, r.Rate))
		}
	}
	if len(others) > 0 {
		best.Note += fmt.Sprintf("; the faster at the consumer's BatchSize (%d) and the limit's best (%d), the other: %s", e.o.batch, res.Limit.config.batch, strings.Join(others, ", "))
	}
	res.ConsumerBare = best
	r, err := run(batch, true)
	if err != nil {
		return err
	}
	res.ConsumerBareDelete = r
	return nil
}

// limitAgain measures the limit's best configuration again, on fresh records.
func (e *env) limitAgain(ctx context.Context, c limitConfig) (*Row, error) {
	if err := e.truncate(ctx); err != nil {
		return nil, err
	}
	in := newLimitInput(records("limit-again-"+e.runID, e.o.messages, e.o.partitions))
	run, err := e.runLimit(ctx, in, c)
	if err != nil {
		return nil, err
	}
	rate := float64(len(in.recs)) / run.elapsed.Seconds()
	e.logf("limit again %s: %.0f msgs/s", c, rate)
	return &Row{Section: "limit", Mode: c.String() + ", again after the consumer", Count: len(in.recs), Seconds: run.elapsed.Seconds(),
		CPU: run.cpu, Work: run.work, Rate: rate, Unit: "msgs/s", config: c}, nil
}

// consumerRun is one consumer measurement.
type consumerRun struct {
	name       string
	n, batch   int
	partitions int
	relay      bool
	prune      bool
	// bare runs the bare consumer (bare.go) instead of idemd's; it publishes its events
	// itself, before each offset commit, and with bareDelete then deletes their rows.
	bare, bareDelete bool
	// byEffects times the run by the effects table (first to last effect row) instead of
	// the group's offsets, as the peers are timed.
	byEffects bool
	// recs, when set, are the records (else records(n) with a fresh prefix).
	recs   []record
	unique int
	topic  string
}

// runConsumer produces the run's records to a new topic (unless it has one), runs the
// consumer child on it until every record is committed, and checks that every distinct id
// has exactly one effect and one outbox row. Tables are not emptied (growth runs pre-fill
// them) except effects.
func (e *env) runConsumer(ctx context.Context, m consumerRun) (*Row, error) {
	e.seq++
	tag := fmt.Sprintf("c%d", e.seq)
	if _, err := e.pool.Exec(ctx, "TRUNCATE "+e.q()+".effects"); err != nil {
		return nil, err
	}
	before, err := e.outboxMax(ctx)
	if err != nil {
		return nil, err
	}
	recs, unique := m.recs, m.unique
	if recs == nil {
		recs, unique = records("evt-"+e.runID+"-"+tag, m.n, m.partitions)
	}
	topic := m.topic
	counts := make([]int64, m.partitions)
	for _, r := range recs {
		counts[r.partition]++
	}
	if topic == "" {
		var err error
		if topic, err = e.topic(ctx, "consumer-"+tag, m.partitions); err != nil {
			return nil, err
		}
		e.logf("producing %d records (%d distinct ids) to %s", len(recs), unique, topic)
		if _, err := e.produce(ctx, topic, recs, m.partitions); err != nil {
			return nil, err
		}
	}
	outTopic := "bench.ledger"
	if m.relay || m.bare {
		var err error
		if outTopic, err = e.topic(ctx, "ledger-"+tag, m.partitions); err != nil {
			return nil, err
		}
	}
	group := "bench-" + e.runID + "-" + tag
	kind := "consumer"
	if m.bare {
		kind = "bare"
	}
	c, err := e.startChild(ctx, kind, childConfig{
		MaxConns: int32(m.partitions + 4), Topic: topic, Group: group, OutboxTopic: outTopic,
		Batch: m.batch, InFlight: e.o.inFlight, Relay: m.relay, RelayBatch: e.o.relayBatch, Prune: m.prune, BareDelete: m.bareDelete,
		ProfileName: fmt.Sprintf("%s-%s-batch%d", kind, tag, m.batch),
	})
	if err != nil {
		return nil, err
	}
	stopSelf := e.profileSelf(fmt.Sprintf("loadgen-%s-%s-batch%d", kind, tag, m.batch))
	defer stopSelf() // on the way out of a failed run; after the load otherwise
	begin := time.Now()
	var (
		counted int
		window  time.Duration
		total   time.Duration
		commits string // with the relay: the rate to the last offset commit
	)
	if m.byEffects {
		first, last, err := e.waitEffects(ctx, unique, 10*time.Minute)
		if err != nil {
			c.kill()
			return nil, err
		}
		// Also wait for the offsets, so that the duplicates at the end are consumed too.
		if _, err := e.waitCommitted(ctx, group, topic, counts, 10*time.Minute); err != nil {
			c.kill()
			return nil, err
		}
		counted, window, total = len(recs), last.Sub(first), last.Sub(begin)
	} else {
		w, err := e.waitCommitted(ctx, group, topic, counts, 10*time.Minute)
		if err != nil {
			c.kill()
			return nil, err
		}
		counted, window, total = len(recs)-int(w.atFirst), w.end.Sub(w.first), w.end.Sub(begin)
		if m.relay {
			// As in production, the run is done when the relay has published what the
			// consumer enqueued: a consumer that outruns its relay only grows the outbox.
			published, err := e.waitPublished(ctx, before, 10*time.Minute)
			if err != nil {
				c.kill()
				return nil, err
			}
			commits = fmt.Sprintf("; to the last offset commit %.0f msgs/s, the relay's last publish %s after it",
				float64(counted)/window.Seconds(), published.Sub(w.end).Round(time.Millisecond))
			if published.After(w.end) {
				window, total = published.Sub(w.first), published.Sub(begin)
			}
		}
	}
	cpu := e.cpuPerMessage(ctx, c, len(recs))
	stopSelf()
	var rss float64
	if m.bare {
		rss, err = e.checkBare(ctx, c, before, outTopic, m.partitions, unique, m.bareDelete)
	} else {
		rss, err = e.checkOnce(ctx, c, before, outTopic, m.partitions, unique, m.relay)
	}
	if err != nil {
		return nil, err
	}
	var work *PGWork
	if c.cpu != nil {
		work = c.cpu.work.workTo(c.cpu.workEnd, len(recs))
	}
	rate := float64(counted) / window.Seconds()
	e.logf("consumer %s: %d msgs in %s (%d msgs, %s from start): %.0f msgs/s, peak RSS %.1f MiB",
		m.name, counted, window.Round(time.Millisecond), len(recs), total.Round(time.Millisecond), rate, rss)
	how := "rate from first to last offset commit"
	switch {
	case m.byEffects:
		how = "rate from first to last effect row"
	case m.bare:
		how = "rate from first to last offset commit (each batch's events published before its offset commit); no fingerprint but SHA-256, no conflicts, no retries, no relay"
		if !m.bareDelete {
			how += ": the outbox rows stay"
		}
	case m.relay:
		how = "rate from the first offset commit to the last offset commit or the relay's last publish, whichever came later" + commits
	}
	return &Row{Section: "consumer", Mode: m.name, Count: counted, Seconds: window.Seconds(), Rate: rate, Unit: "msgs/s",
		PeakRSSMiB: rss, CPU: cpu, Work: work, Note: fmt.Sprintf("%d records, %d distinct ids, %d duplicates on %d partitions; each effect and outbox row once; %s (all %d from child start: %.0f msgs/s)",
			len(recs), unique, len(recs)-unique, m.partitions, how, len(recs), float64(len(recs))/total.Seconds())}, nil
}

// outboxMax is the last outbox id so far: the rows of a run come after it.
func (e *env) outboxMax(ctx context.Context) (int64, error) {
	var before int64
	err := e.pool.QueryRow(ctx, "SELECT coalesce(max(id), 0) FROM "+e.q()+".outbox").Scan(&before)
	return before, err
}

// checkOnce stops the consumer child c and checks that the run applied exactly one effect
// per distinct id and enqueued its event: every distinct id's event is still waiting in
// the outbox (rows after before) or, with the relay running, on its topic (the relay deletes
// what it published, or marks it with -keep-published). A record may be on the topic twice
// and a published row still be waiting (at least once: the relay was stopped between a
// publish and its mark). It returns the child's peak RSS.
func (e *env) checkOnce(ctx context.Context, c *child, before int64, outTopic string, partitions, unique int, relay bool) (float64, error) {
	var published func(map[string]bool) error
	if relay {
		published = func(ids map[string]bool) error { return e.readCausations(ctx, outTopic, partitions, ids) }
	}
	rss, _, err := e.checkOnceWith(ctx, c, before, unique, 0, published)
	return rss, err
}

// checkOnceWith is checkOnce with the published events' causation ids added by published
// (nil: no relay ran), and with the retention the child's records had (0: longer than the
// run). A repeat that came at least one retention after its id was applied is applied
// again, as retention says, and is not a duplicate; checkOnceWith returns how many there
// were.
func (e *env) checkOnceWith(ctx context.Context, c *child, before int64, unique int, retention time.Duration, published func(map[string]bool) error) (float64, int, error) {
	rss, effects, err := e.stopAndCount(ctx, c)
	if err != nil {
		return rss, 0, err
	}
	events, err := e.waitingCausations(ctx, before)
	if err != nil {
		return rss, 0, err
	}
	if published != nil {
		if err := published(events); err != nil {
			return rss, 0, err
		}
	}
	r, err := e.repeats(ctx, retention)
	if err != nil {
		return rss, 0, err
	}
	return rss, r.late, onceVerdict(effects, len(events), unique, r)
}

// onceVerdict checks a run that applied effects (repeats r among them) and enqueued the
// events of events distinct ids, for unique distinct ids: every id applied, none applied
// again within its retention, every id's event enqueued. A lost effect and a duplicate
// cannot hide each other, as they would in a count of effects alone.
func onceVerdict(effects, events, unique int, r repeats) error {
	applied := effects - r.late - r.early // distinct ids: each repeat is one more effect of an id
	if applied != unique || r.early > 0 || events != unique {
		return fmt.Errorf("consumer applied %d effects to %d distinct ids and enqueued events of %d ids, for %d distinct ids: not exactly once (%s)", effects, applied, events, unique, r)
	}
	return nil
}

// repeats are the effects that applied an id again, after the application before them.
type repeats struct {
	retention time.Duration
	// late came at least one retention after; early came sooner (duplicates).
	late, early int
	// earlyGaps are the smallest and the largest time since the application before, of
	// the early ones.
	earlyGaps [2]time.Duration
}

func (r repeats) String() string {
	if r.late+r.early == 0 {
		return "no id applied twice"
	}
	s := fmt.Sprintf("%d effects applied an id again sooner than a retention (%s) after the application before", r.early, r.retention)
	if r.early > 0 {
		s += fmt.Sprintf(", %s to %s after it", r.earlyGaps[0].Round(time.Millisecond), r.earlyGaps[1].Round(time.Millisecond))
	}
	return s + fmt.Sprintf("; %d later than that, as retention allows", r.late)
}

// repeats reads the effects table's repeats under retention (0: every repeat is early).
func (e *env) repeats(ctx context.Context, retention time.Duration) (repeats, error) {
	r := repeats{retention: retention}
	limit := retention
	if limit <= 0 {
		limit = 100 * 365 * 24 * time.Hour
	}
	var lo, hi *int64
	// gap: microseconds since the id's application before.
	err := e.pool.QueryRow(ctx, `WITH twice AS (SELECT message_id FROM `+e.q()+`.effects GROUP BY message_id HAVING count(*) > 1),
gaps AS (SELECT (extract(epoch FROM applied_at - lag(applied_at) OVER (PARTITION BY message_id ORDER BY applied_at)) * 1e6)::bigint AS gap
    FROM `+e.q()+`.effects WHERE message_id IN (SELECT message_id FROM twice))
SELECT count(*) FILTER (WHERE gap >= $1), count(*) FILTER (WHERE gap < $1),
       min(gap) FILTER (WHERE gap < $1), max(gap) FILTER (WHERE gap < $1)
FROM gaps WHERE gap IS NOT NULL`, limit.Microseconds()).Scan(&r.late, &r.early, &lo, &hi)
	if lo != nil && hi != nil {
		r.earlyGaps = [2]time.Duration{time.Duration(*lo) * time.Microsecond, time.Duration(*hi) * time.Microsecond}
	}
	return r, err
}

// checkBare stops the bare consumer c and checks that it wrote one effect and one outbox
// row per distinct id (deleted, with deletes), and published every distinct id's event to
// outTopic.
func (e *env) checkBare(ctx context.Context, c *child, before int64, outTopic string, partitions, unique int, deletes bool) (float64, error) {
	rss, effects, err := e.stopAndCount(ctx, c)
	if err != nil {
		return rss, err
	}
	waiting, err := e.waitingCausations(ctx, before)
	if err != nil {
		return rss, err
	}
	published := make(map[string]bool, unique)
	if err := e.readCausations(ctx, outTopic, partitions, published); err != nil {
		return rss, err
	}
	rows := unique
	if deletes {
		rows = 0
	}
	r, err := e.repeats(ctx, 0)
	if err != nil {
		return rss, err
	}
	if effects != unique || r.early > 0 || len(waiting) != rows || len(published) != unique {
		return rss, fmt.Errorf("bare consumer wrote %d effects (%s), left outbox rows of %d ids (want %d), and published events of %d ids, for %d distinct ids", effects, r, len(waiting), rows, len(published), unique)
	}
	return rss, nil
}

// stopAndCount stops c and returns its peak RSS and how many effects the run wrote.
func (e *env) stopAndCount(ctx context.Context, c *child) (float64, int, error) {
	rss, err := c.stop()
	if err != nil {
		return rss, 0, err
	}
	if c.cpu != nil && c.cpu.work != nil {
		c.cpu.workEnd = e.pgCountersAfter(ctx, c.cpu.app)
	}
	effects, err := e.count(ctx, "{schema}.effects")
	return rss, effects, err
}

// hashMod spreads ids over n partitions (or workers) as a Kafka producer's key hash does.
func hashMod(id string, n int) int {
	h := fnv.New32a()
	h.Write([]byte(id))
	return int(h.Sum32() % uint32(n))
}

// waitEffects polls the effects table until it holds want rows and returns when the first
// and the last appeared (to the 10 ms poll).
func (e *env) waitEffects(ctx context.Context, want int, timeout time.Duration) (first, last time.Time, err error) {
	deadline := time.Now().Add(timeout)
	for {
		n, err := e.count(ctx, "{schema}.effects")
		now := time.Now()
		if err != nil {
			return first, last, err
		}
		if n > 0 && first.IsZero() {
			first = now
		}
		if n >= want {
			return first, now, nil
		}
		if now.After(deadline) {
			return first, last, fmt.Errorf("%d of %d effects after %s", n, want, timeout)
		}
		select {
		case <-ctx.Done():
			return first, last, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// progress is when a group's commits started and ended.
type progress struct {
	// first is when a committed offset was first seen; atFirst is how many records the
	// commits then covered.
	first   time.Time
	atFirst int64
	end     time.Time
}

// committedPoll is how often waitCommitted asks for the committed offsets. Each poll is a
// FindCoordinator and an OffsetFetch, served by the in-process broker's one loop beside
// the consumer's fetches and produces, on the cores the consumer runs on: polled every
// 2 ms (until phase 43), the load generator's process took a half more CPU during a
// consumer run than it does now, which the limit does not pay. A run's window is off by at
// most the poll at each end, in either direction: 0.1 % of a 10 s run.
const committedPoll = 10 * time.Millisecond

// waitCommitted polls the group's committed offsets until every partition's reaches want.
func (e *env) waitCommitted(ctx context.Context, group, topic string, want []int64, timeout time.Duration) (progress, error) {
	var pr progress
	cl := &kafka.Client{Addr: kafka.TCP(e.brokers...), Timeout: 10 * time.Second}
	parts := make([]int, len(want))
	for i := range parts {
		parts[i] = i
	}
	deadline := time.Now().Add(timeout)
	for {
		resp, err := cl.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: parts}})
		now := time.Now()
		if err == nil {
			done, sum := 0, int64(0)
			for _, p := range resp.Topics[topic] {
				if p.Error == nil && p.CommittedOffset > 0 {
					sum += p.CommittedOffset
				}
				if p.Error == nil && p.Partition < len(want) && p.CommittedOffset >= want[p.Partition] {
					done++
				}
			}
			if sum > 0 && pr.first.IsZero() {
				pr.first, pr.atFirst = now, sum
			}
			if done == len(want) {
				pr.end = now
				return pr, nil
			}
		}
		if now.After(deadline) {
			return pr, fmt.Errorf("group %s did not commit every offset of %s within %s (%v)", group, topic, timeout, err)
		}
		select {
		case <-ctx.Done():
			return pr, ctx.Err()
		case <-time.After(committedPoll):
		}
	}
}

// waitPublished polls the outbox until no row after id before waits to be published, and
// returns when it found it so (to the 5 ms poll).
func (e *env) waitPublished(ctx context.Context, before int64, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	for {
		var waiting bool
		err := e.pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM "+e.q()+".outbox WHERE id > $1 AND published_at IS NULL)", before).Scan(&waiting)
		now := time.Now()
		switch {
		case err != nil:
			return now, err
		case !waiting:
			return now, nil
		case now.After(deadline):
			return now, fmt.Errorf("the relay left outbox rows unpublished %s after the consumer committed its last offset", timeout)
		}
		select {
		case <-ctx.Done():
			return now, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// waitingCausations are the causation ids of the outbox rows after id before that wait.
func (e *env) waitingCausations(ctx context.Context, before int64) (map[string]bool, error) {
	rows, err := e.pool.Query(ctx, "SELECT causation_id FROM "+e.q()+".outbox WHERE id > $1 AND published_at IS NULL", before)
	if err != nil {
		return nil, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	out := make(map[string]bool, len(ids))
	for _, id := range ids {
		out[id] = true
	}
	return out, nil
}

// readCausations adds the causation-id header of every record of topic to ids.
func (e *env) readCausations(ctx context.Context, topic string, partitions int, ids map[string]bool) error {
	cl := &kafka.Client{Addr: kafka.TCP(e.brokers...), Timeout: 10 * time.Second}
	reqs := make([]kafka.OffsetRequest, partitions)
	for p := range reqs {
		reqs[p] = kafka.LastOffsetOf(p)
	}
	resp, err := cl.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for _, po := range resp.Topics[topic] {
		if po.Error != nil {
			return po.Error
		}
		if po.LastOffset == 0 {
			continue
		}
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: e.brokers, Topic: topic, Partition: po.Partition, MinBytes: 1, MaxBytes: 10 << 20, MaxWait: 100*time.Millisecond + consumer.FetchAnswerMargin})
		for {
			m, err := r.ReadMessage(rctx)
			if err != nil {
				_ = r.Close()
				return fmt.Errorf("reading %s/%d: %w", topic, po.Partition, err)
			}
			for _, h := range m.Headers {
				if h.Key == outbox.HeaderCausationID {
					ids[string(h.Value)] = true
				}
			}
			if m.Offset+1 >= po.LastOffset {
				break
			}
		}
		_ = r.Close()
	}
	return nil
}

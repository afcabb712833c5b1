package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"
)

// Row is one measured figure.
type Row struct {
	Section    string  `json:"section"`
	Mode       string  `json:"mode"`
	Count      int     `json:"count"`
	Seconds    float64 `json:"seconds"`
	Rate       float64 `json:"rate"`
	Unit       string  `json:"unit"`
	P50ms      float64 `json:"p50_ms,omitempty"`
	P99ms      float64 `json:"p99_ms,omitempty"`
	P999ms     float64 `json:"p999_ms,omitempty"`
	PeakRSSMiB float64 `json:"peak_rss_mib,omitempty"`
	// CPU is the CPU time per message of idemd, of PostgreSQL's backends serving it, and of
	// the load generator (with the in-process broker), when measured.
	CPU *CPU `json:"cpu,omitempty"`
	// Work is PostgreSQL's work per message, when counted (pgwork.go).
	Work *PGWork `json:"pg_work,omitempty"`
	Note string  `json:"note,omitempty"`

	config limitConfig
}

// Ratio is a figure beside its baseline from the same run, with the goal it is held to.
type Ratio struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	Goal  string  `json:"goal"`
	Met   bool    `json:"met"`
}

// Sizes are the on-disk sizes of idemd's two growing tables at one point of a run.
type Sizes struct {
	When string `json:"when"`
	// At is when, in seconds from the run's start; Rate the consumer's messages/s since the
	// sample before; Role "reference" or "end" for the samples of the two windows the goal
	// compares, "third" for those of the third period, "no pruner" for the sample after
	// the run without the pruner; Half 1 or 2 for the samples of the steady state's first
	// half (from three periods in to the middle) and second half (after the middle), the
	// windows the goal compares since phase 7.
	At   float64 `json:"at_s"`
	Rate float64 `json:"rate"`
	Role string  `json:"role,omitempty"`
	Half int     `json:"half,omitempty"`
	// ProcessedVacuums and OutboxVacuums count the VACUUMs run on each table so far
	// (OutboxVacuums: the outbox's and outbox_published's).
	ProcessedVacuums int `json:"processed_vacuums"`
	OutboxVacuums    int `json:"outbox_vacuums"`
	// Rows are live rows (count(*)); DeadRows are pg_stat_user_tables' n_dead_tup.
	ProcessedRows int64 `json:"processed_rows"`
	ProcessedDead int64 `json:"processed_dead_rows"`
	// ProcessedUnexpired are the live rows whose retention has not passed: what the
	// table must hold whatever the pruner and VACUUM do.
	ProcessedUnexpired int64 `json:"processed_unexpired_rows"`
	// ProcessedEpochsHeld are the live rows of the partitions that hold at least one
	// unexpired row. With epochs (a partition dropped whole once every record in it has
	// expired) they are the rows the pruner must leave, expired or not: the rows of an
	// epoch it could drop and has not are not among them. Row by row (one partition), all
	// the live rows.
	ProcessedEpochsHeld int64 `json:"processed_epochs_held_rows"`
	ProcessedHeapMiB    float64
	ProcessedPKeyMiB    float64
	ProcessedExpMiB     float64
	ProcessedTotalMiB   float64
	OutboxRows          int64 `json:"outbox_rows"`
	OutboxDead          int64 `json:"outbox_dead_rows"`
	// OutboxHeapMiB and OutboxPKeyMiB are the outbox's (the rows still to publish);
	// OutboxPubMiB is outbox_published's with its indexes (published rows kept, migration
	// 0008); OutboxRows, OutboxDead and OutboxTotalMiB count both tables.
	OutboxHeapMiB  float64
	OutboxPKeyMiB  float64
	OutboxPubMiB   float64
	OutboxTotalMiB float64
}

// GrowthPoint is the consumer and the limit, then the receiver and the naive receiver, on
// tables pre-filled to Rows rows.
type GrowthPoint struct {
	Rows       int  `json:"rows"`
	Limit      *Row `json:"limit"`
	LimitClaim *Row `json:"limit_idemd_claim"`
	Consumer   *Row `json:"consumer"`
	// Rounds are the point's rounds of the limit and the consumer back to back (since
	// phase 34); the growth goal compares the median of their ratios.
	Rounds   []GrowthRound `json:"rounds,omitempty"`
	Receiver *Row          `json:"receiver,omitempty"`
	Naive    *Row          `json:"naive,omitempty"`
}

// GrowthRound is one run of the limit (its strongest form at the point) and one of the
// consumer (relay running), back to back on fresh ids.
type GrowthRound struct {
	Limit    float64 `json:"limit_msgs_per_s"`
	Consumer float64 `json:"consumer_msgs_per_s"`
}

// roundsRatio is the median of the point's rounds' consumer/limit, with the lowest and the
// highest; ok is false without rounds.
func (g GrowthPoint) roundsRatio() (median, lo, hi float64, ok bool) {
	var v []float64
	for _, r := range g.Rounds {
		if r.Limit > 0 {
			v = append(v, r.Consumer/r.Limit)
		}
	}
	if len(v) == 0 {
		return 0, 0, 0, false
	}
	slices.Sort(v)
	median = v[len(v)/2]
	if len(v)%2 == 0 {
		median = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return median, v[0], v[len(v)-1], true
}

// Results is everything one run measured.
type Results struct {
	Machine         Machine        `json:"machine"`
	Options         map[string]any `json:"options"`
	Limit           *Row           `json:"limit,omitempty"`
	LimitAll        []*Row         `json:"limit_all,omitempty"`
	LimitAgain      *Row           `json:"limit_again,omitempty"`
	LimitOne        *Row           `json:"limit_one_tx,omitempty"`
	Consumer        *Row           `json:"consumer,omitempty"`
	ConsumerNoRelay *Row           `json:"consumer_no_relay,omitempty"`
	ConsumerBare    *Row           `json:"consumer_bare,omitempty"`
	// ConsumerBareDelete is the bare consumer deleting its published outbox rows.
	ConsumerBareDelete *Row          `json:"consumer_bare_delete,omitempty"`
	ConsumerOne        *Row          `json:"consumer_one_tx,omitempty"`
	Brokers            []*Row        `json:"brokers,omitempty"`
	PubSub             *Row          `json:"-"`
	PubSubOnly         *Row          `json:"-"`
	SQS                *Row          `json:"-"`
	SQSShortLease      *Row          `json:"-"`
	SQSOnly            *Row          `json:"-"`
	Receiver           *Row          `json:"receiver,omitempty"`
	ReceiverOne        *Row          `json:"receiver_one_tx,omitempty"`
	Naive              *Row          `json:"naive_receiver,omitempty"`
	Relay              *Row          `json:"relay,omitempty"`
	RelayLatency       *Row          `json:"relay_latency,omitempty"`
	RelayUnderLoad     *Row          `json:"relay_under_load,omitempty"`
	Peers              []*Row        `json:"peers,omitempty"`
	PeersIdemd         *Row          `json:"-"`
	PeersWatermill     *Row          `json:"-"`
	PeersKafkaGo       *Row          `json:"-"`
	Growth             []GrowthPoint `json:"growth,omitempty"`
	PruneSteady        *Row          `json:"prune_steady,omitempty"`
	PruneOff           *Row          `json:"prune_off,omitempty"`
	PruneSizes         []Sizes       `json:"prune_sizes,omitempty"`
	// PruneByEpochs says the prune section's pruner dropped epochs, not rows.
	PruneByEpochs bool   `json:"prune_by_epochs,omitempty"`
	Amplification []*Row `json:"amplification,omitempty"`
	// Drop is the receiver while an expired epoch of DropRows records is dropped;
	// DropDuringP99 and DropWorst are the latencies of the webhooks due during the drop,
	// in ms.
	Drop          *Row     `json:"drop,omitempty"`
	DropRows      int      `json:"drop_rows,omitempty"`
	DropDuringP99 float64  `json:"drop_during_p99_ms,omitempty"`
	DropWorst     float64  `json:"drop_during_worst_ms,omitempty"`
	Notes         []string `json:"notes,omitempty"`
	Ratios        []Ratio  `json:"ratios"`
}

func (o *options) public() map[string]any {
	return map[string]any{
		"messages": o.messages, "messages_one": o.messagesOne, "partitions": o.partitions, "batch": o.batch,
		"limit_batches": o.limitBatches, "limit_workers": o.limitWorkers, "duration": o.duration.String(),
		"duration_one": o.durationOne.String(), "concurrency": o.concurrency, "max_batch": o.maxBatch,
		"receiver_conns": o.receiverConns, "relay_events": o.relayEvents, "relay_batch": o.relayBatch,
		"relay_rate": o.relayRate, "relay_duration": o.relayDuration.String(), "peer_messages": o.peerMessages,
		"peer_partitions": o.peerPartitions, "growth_rows": o.growthRows, "growth_messages": o.growthMessages, "growth_rounds": o.growthRounds, "growth_epochs": o.growthEpochs, "drop_rows": o.dropRows, "drop_duration": o.dropDuration.String(),
		"prune_retention": o.pruneRetention.String(), "prune_periods": o.prunePeriods, "prune_interval": o.pruneInterval.String(), "prune_naptime": o.pruneNaptime.String(), "prune_vacuum_clock": o.pruneVacClock, "broker_messages": o.brokerMessages, "pubsub_messages": o.pubsubMessages, "sqs_pollers": o.sqsPollers, "only": o.only, "keep_published": o.keepPublished,
	}
}

// ratios computes the figures the goals are about, where both sides were measured.
func (r *Results) ratios() []Ratio {
	var out []Ratio
	add := func(name string, v float64, goal string, met bool) {
		out = append(out, Ratio{Name: name, Value: v, Goal: goal, Met: met})
	}
	info := func(name string, v float64) { add(name, v, "(info)", true) }
	limit := r.limitRate()
	if r.Consumer != nil && limit > 0 {
		v := r.Consumer.Rate / limit
		add("consumer (relay running) / limit", v, ">= 0.70", v >= 0.7)
		if r.ConsumerNoRelay != nil {
			info("consumer (no relay) / limit", r.ConsumerNoRelay.Rate/limit)
		}
		if r.ConsumerBare != nil {
			info("bare consumer / limit: how close any consumer came here", r.ConsumerBare.Rate/limit)
			info("consumer (relay running) / bare consumer", r.Consumer.Rate/r.ConsumerBare.Rate)
		}
		if r.ConsumerBareDelete != nil {
			info("bare consumer deleting its published rows / limit", r.ConsumerBareDelete.Rate/limit)
			info("consumer (relay running) / bare consumer deleting its published rows", r.Consumer.Rate/r.ConsumerBareDelete.Rate)
		}
	}
	// The same ratios by CPU per message, the broker's left out: what the consumers would
	// reach if the machine's two cores ran only them and PostgreSQL, the broker elsewhere
	// as in production (the limit reads no broker; the consumers' in-process broker, in the
	// bench's process, takes its share of the same cores).
	if lc := r.limitRow(); lc != nil && lc.CPU != nil && lc.CPU.IdemdUs+lc.CPU.PostgresUs > 0 {
		for _, c := range []struct {
			name string
			row  *Row
		}{{"consumer (relay running)", r.Consumer}, {"bare consumer", r.ConsumerBare}, {"bare consumer deleting its published rows", r.ConsumerBareDelete}} {
			if c.row == nil || c.row.CPU == nil || c.row.CPU.IdemdUs+c.row.CPU.PostgresUs <= 0 {
				continue
			}
			info(c.name+" / limit, by CPU per message of the process and its PostgreSQL backends (the broker's left out)",
				(lc.CPU.IdemdUs+lc.CPU.PostgresUs)/(c.row.CPU.IdemdUs+c.row.CPU.PostgresUs))
		}
	}
	// PostgreSQL's work per message, the consumer's over the limit's (counted, not timed).
	if lw := r.Limit; lw != nil && lw.Work != nil {
		for _, c := range []struct {
			name string
			row  *Row
		}{{"consumer (relay running)", r.Consumer}, {"consumer (no relay)", r.ConsumerNoRelay}, {"bare consumer deleting its published rows", r.ConsumerBareDelete}} {
			if c.row == nil || c.row.Work == nil {
				continue
			}
			if lw.Work.WALRecords > 0 {
				info(c.name+" / limit: PostgreSQL's WAL records per message", c.row.Work.WALRecords/lw.Work.WALRecords)
			}
			if lw.Work.Buffers > 0 {
				info(c.name+" / limit: PostgreSQL's buffers per message", c.row.Work.Buffers/lw.Work.Buffers)
			}
		}
	}
	for _, b := range []struct {
		name       string
		idemd, own *Row
	}{{"Pub/Sub subscription", r.PubSub, r.PubSubOnly}, {"SQS subscription", r.SQS, r.SQSOnly}, {"SQS subscription, lease 2 s", r.SQSShortLease, r.SQSOnly}} {
		if b.idemd == nil {
			continue
		}
		if limit > 0 {
			info(b.name+" (relay running) / limit", b.idemd.Rate/limit)
		}
		if b.own != nil {
			info(b.name+" / broker-only client, same fake", b.idemd.Rate/b.own.Rate)
		}
		if r.Consumer != nil {
			info(b.name+" / Kafka consumer (relay running)", b.idemd.Rate/r.Consumer.Rate)
		}
	}
	if r.Consumer != nil && r.ConsumerOne != nil {
		info("consumer / consumer one tx per message", r.Consumer.Rate/r.ConsumerOne.Rate)
	}
	if r.Limit != nil && r.LimitOne != nil {
		info("limit / limit one tx per message", r.Limit.Rate/r.LimitOne.Rate)
	}
	if r.PeersIdemd != nil && r.PeersWatermill != nil {
		v := r.PeersIdemd.Rate / r.PeersWatermill.Rate
		add("consumer / Watermill, same topic", v, ">= 10", v >= 10)
	}
	if r.PeersIdemd != nil && r.PeersKafkaGo != nil {
		info("consumer / kafka-go one tx per message, same topic", r.PeersIdemd.Rate/r.PeersKafkaGo.Rate)
	}
	if r.Receiver != nil && r.Naive != nil {
		v := r.Receiver.Rate / r.Naive.Rate
		add("receiver / naive net/http receiver", v, ">= 3", v >= 3)
	}
	if r.Receiver != nil {
		add("receiver p99 ms at 64 connections", r.Receiver.P99ms, "<= 50", r.Receiver.P99ms <= 50)
	}
	if r.Receiver != nil && r.ReceiverOne != nil {
		info("receiver / receiver MaxBatch 1", r.Receiver.Rate/r.ReceiverOne.Rate)
	}
	if r.RelayUnderLoad != nil {
		add("relay 2xx-to-record p99 ms at 1,000 webhooks/s", r.RelayUnderLoad.P99ms, "<= 50", r.RelayUnderLoad.P99ms <= 50)
	}
	if r.RelayLatency != nil {
		info("relay commit-to-record p99 ms, no other load", r.RelayLatency.P99ms)
	}
	if r.Relay != nil && r.Limit != nil {
		info("relay drain events/s / limit msgs/s", r.Relay.Rate/r.Limit.Rate)
	}
	if g0, gn, ok := r.growthEnds(); ok {
		m0, lo0, hi0, ok0 := g0.roundsRatio()
		mn, lon, hin, okn := gn.roundsRatio()
		if ok0 && okn {
			// The goal: each point's ratio is the median of its rounds, each round the
			// limit and the consumer back to back (since phase 34).
			v := mn / m0
			add(fmt.Sprintf("consumer/limit at %s rows / at 0 rows, medians of %d and %d rounds", human(gn.Rows), len(gn.Rounds), len(g0.Rounds)), v, ">= 0.90", v >= 0.9)
			info(fmt.Sprintf("consumer/limit at 0 rows, median of its rounds (lowest %.3f, highest %.3f)", lo0, hi0), m0)
			info(fmt.Sprintf("consumer/limit at %s rows, median of its rounds (lowest %.3f, highest %.3f)", human(gn.Rows), lon, hin), mn)
		}
		if g0.Limit != nil && g0.Consumer != nil && gn.Limit != nil && gn.Consumer != nil {
			r0 := g0.Consumer.Rate / g0.Limit.Rate
			rn := gn.Consumer.Rate / gn.Limit.Rate
			v := rn / r0
			if ok0 && okn {
				info(fmt.Sprintf("consumer/limit at %s rows / at 0 rows, the fastest runs of each side (the goal until phase 34)", human(gn.Rows)), v)
			} else {
				add(fmt.Sprintf("consumer/limit at %s rows / at 0 rows", human(gn.Rows)), v, ">= 0.90", v >= 0.9)
			}
			info(fmt.Sprintf("limit at %s rows / at 0 rows", human(gn.Rows)), gn.Limit.Rate/g0.Limit.Rate)
			info(fmt.Sprintf("consumer at %s rows / at 0 rows", human(gn.Rows)), gn.Consumer.Rate/g0.Consumer.Rate)
			if g0.LimitClaim != nil && gn.LimitClaim != nil {
				info(fmt.Sprintf("limit with idemd's claim at %s rows / at 0 rows", human(gn.Rows)), gn.LimitClaim.Rate/g0.LimitClaim.Rate)
			}
		}
		// The receiver's baseline is the naive receiver, on the same tables in the same
		// minute: its ratio must hold as the tables grow, and its p99 stay within the goal.
		if g0.Receiver != nil && g0.Naive != nil && gn.Receiver != nil && gn.Naive != nil {
			v := (gn.Receiver.Rate / gn.Naive.Rate) / (g0.Receiver.Rate / g0.Naive.Rate)
			add(fmt.Sprintf("receiver/naive at %s rows / at 0 rows", human(gn.Rows)), v, ">= 0.90", v >= 0.9)
			info(fmt.Sprintf("receiver at %s rows / at 0 rows", human(gn.Rows)), gn.Receiver.Rate/g0.Receiver.Rate)
			info(fmt.Sprintf("naive receiver at %s rows / at 0 rows", human(gn.Rows)), gn.Naive.Rate/g0.Naive.Rate)
		}
		// The other yardstick: the receiver against the SQL limit on tables of the
		// same size. The naive receiver waits on a commit per request and hardly feels the
		// tables' size, so the ratio above moves with its noise more than with idemd.
		if g0.Receiver != nil && g0.Limit != nil && gn.Receiver != nil && gn.Limit != nil {
			v := (gn.Receiver.Rate / gn.Limit.Rate) / (g0.Receiver.Rate / g0.Limit.Rate)
			info(fmt.Sprintf("receiver/limit at %s rows / at 0 rows", human(gn.Rows)), v)
		}
	}
	for i, g := range r.Growth {
		size := sizeLabel(g.Rows, slices.ContainsFunc(r.Growth[:i], func(p GrowthPoint) bool { return p.Rows == g.Rows }))
		if g.Receiver != nil && g.Naive != nil {
			info(fmt.Sprintf("receiver / naive receiver at %s rows", size), g.Receiver.Rate/g.Naive.Rate)
		}
		if g.Receiver != nil {
			add(fmt.Sprintf("receiver p99 ms at 64 connections, %s rows", size), g.Receiver.P99ms, "<= 50", g.Receiver.P99ms <= 50)
		}
	}
	if r.PruneSteady != nil && r.PruneOff != nil {
		info("consumer with the pruner (steady state) / without it, same tables", r.PruneSteady.Rate/r.PruneOff.Rate)
		// The same, over the half period just before (the machine is shared: adjacent
		// windows of equal length compare best).
		for i := len(r.PruneSizes) - 1; i >= 0; i-- {
			if s := r.PruneSizes[i]; s.Role == "end" {
				info("consumer with the pruner (its last half period) / without it (the next)", s.Rate/r.PruneOff.Rate)
				break
			}
		}
	}
	if w, ok := r.pruneWindows(); ok {
		// Each relation of processed_messages (the table retention fills), by its largest
		// size in the second half of the steady state against its largest in the first
		// (from three periods in, once the live rows have levelled off, to the middle):
		// sizes move in a sawtooth as VACUUM falls behind, truncates a heap and it grows
		// again, and the largest of some twenty samples is the sawtooth's height where the
		// largest of three (the windows before phase 7: the period after the middle and the
		// last period) was whichever tooth they fell on. A relation still growing at the
		// end shows in its second half. Row by row, more unexpired rows (the most seen
		// until the window's end) excuse as much growth; fewer excuse nothing, since a
		// table whose rows are deleted does not shrink. With epochs, see below. The goal
		// is the relation that grew most; the outbox, a queue whose size follows the
		// relay's lag rather than the retention, both tables' total, the windows before
		// phase 7 and the growth from the third period to the reference are shown beside
		// it.
		first, second := w.first, w.second
		grown := max(1, float64(second.unexpired)/float64(max(first.unexpired, 1)))
		per := "per unexpired row if more"
		// goalFirst and goalSecond are the samples the goal compares.
		goalFirst, goalSecond := first, second
		if r.PruneByEpochs && first.epochsHeld > 0 && second.epochsHeld > 0 {
			// With epochs a table does shrink: an epoch is dropped whole and leaves
			// nothing behind, so the sizes follow the rows of the epochs the pruner must
			// keep (those holding an unexpired record), fewer as much as more. Divided by
			// them both ways, the ratio is the growth per row held, which is what bloat
			// would raise; the rows of an epoch the pruner could drop and has not are not
			// in the divisor, so a pruner that falls behind raises it too.
			//
			// Since phase 38 the goal compares the samples where no expired epoch waited
			// for the pruner's next pass: at the others the largest size held the waiting
			// epoch's rows as well, which the divisor leaves out, and the pruner's
			// interval, not the tables, decided the goal (phase 38, item 5). A half
			// without such a sample is one where the pruner never caught up: the goal
			// then compares every sample, and the rows left waiting raise it.
			if first.caught != nil && second.caught != nil {
				goalFirst, goalSecond = *first.caught, *second.caught
			}
			grown = float64(goalSecond.epochsHeld) / float64(goalFirst.epochsHeld)
			per = "per row of the epochs held"
		}
		rels := []struct {
			name           string
			second, first  float64
			end, reference float64
		}{
			{"heap", second.heap, first.heap, w.end.heap, w.ref.heap},
			{"pkey", second.pkey, first.pkey, w.end.pkey, w.ref.pkey},
			{"expires_at index", second.exp, first.exp, w.end.exp, w.ref.exp},
			{"outbox, total", second.outbox, first.outbox, w.end.outbox, w.ref.outbox},
			{"both tables, total", second.total, first.total, w.end.total, w.ref.total},
		}
		// The relation of processed_messages' own (the first three) that grew most, per
		// unexpired row when there are more (grown).
		worstOf := func(later, earlier func(int) float64, grown float64) (worst string, v float64) {
			for i, p := range rels[:3] {
				if g := later(i) / max(earlier(i), 1e-9) / grown; g > v {
					worst, v = p.name, g
				}
			}
			return worst, v
		}
		goalSizes := [][2]float64{{goalSecond.heap, goalFirst.heap}, {goalSecond.pkey, goalFirst.pkey}, {goalSecond.exp, goalFirst.exp}}
		worst, v := worstOf(func(i int) float64 { return goalSizes[i][0] }, func(i int) float64 { return goalSizes[i][1] }, grown)
		add(fmt.Sprintf("processed_messages, largest size in the second half / the first, %s (worst: %s)", per, worst), v, pruneGoal, v <= pruneTolerance)
		if r.PruneByEpochs {
			info(fmt.Sprintf("samples with an expired epoch waiting for the pruner, left out of the goal when each half has others: first half %d of %d, second half %d of %d", first.waiting, first.n, second.waiting, second.n), float64(second.waiting)/float64(max(second.n, 1)))
		}
		for i, p := range rels {
			if i < 3 {
				p.name = "processed_messages " + p.name
			}
			if p.first > 0 {
				info(p.name+", second half / first half", p.second/p.first)
			}
		}
		info(fmt.Sprintf("most unexpired dedup rows until the second half's end / the first's (%d / %d)", second.unexpired, first.unexpired), float64(second.unexpired)/float64(max(first.unexpired, 1)))
		info(fmt.Sprintf("most dedup rows held (live + dead), second half / first half (%d / %d)", second.held, first.held), float64(second.held)/float64(max(first.held, 1)))
		if r.PruneByEpochs {
			info(fmt.Sprintf("most rows of the epochs held (those with an unexpired record), second half / first half (%d / %d)", second.epochsHeld, first.epochsHeld), float64(second.epochsHeld)/float64(max(first.epochsHeld, 1)))
		}
		if w.ref.total > 0 && w.end.total > 0 {
			gr := max(1, float64(w.end.unexpired)/float64(max(w.ref.unexpired, 1)))
			oldWorst, old := worstOf(func(i int) float64 { return rels[i].end }, func(i int) float64 { return rels[i].reference }, gr)
			info(fmt.Sprintf("before phase 7's windows: largest in the last period / the period after the middle, per unexpired row if more (worst: %s)", oldWorst), old)
		}
		if w.third.pkey > 0 {
			info(fmt.Sprintf("warm-up: processed_messages pkey, reference / third period (unexpired %d / %d)", w.ref.unexpired, w.third.unexpired), w.ref.pkey/w.third.pkey)
		}
	}
	if r.Drop != nil {
		info(fmt.Sprintf("receiver p99 ms of the webhooks due while an epoch of %s records dropped (the receiver's goal is 50)", human(r.DropRows)), r.DropDuringP99)
		info("receiver's worst latency ms while it dropped", r.DropWorst)
	}
	var peak float64
	for _, row := range r.idemdRows() {
		peak = max(peak, row.PeakRSSMiB)
	}
	if peak > 0 {
		add("peak RSS of idemd, MiB (max over loads)", peak, "<= 150 MB", peak*1.048576 <= 150)
	}
	return out
}

// limitRow is the limit the consumers are compared to: the faster of the limit and its
// measurement again after the consumer; nil when the limit was not measured.
func (r *Results) limitRow() *Row {
	row := r.Limit
	if row != nil && r.LimitAgain != nil && r.LimitAgain.Rate > row.Rate {
		row = r.LimitAgain
	}
	return row
}

// limitRate is limitRow's rate; 0 when the limit was not measured.
func (r *Results) limitRate() float64 {
	if row := r.limitRow(); row != nil {
		return row.Rate
	}
	return 0
}

// growthEnds are the growth points the goal compares: the largest size, and the empty
// tables measured closest in time to it (the last 0-row point before or after it).
func (r *Results) growthEnds() (g0, gn GrowthPoint, ok bool) {
	largest, at := -1, -1
	for i, g := range r.Growth {
		if g.Rows > largest {
			largest, at = g.Rows, i
		}
	}
	if largest <= 0 {
		return g0, gn, false
	}
	best := -1
	for i, g := range r.Growth {
		if g.Rows == 0 && (best < 0 || abs(i-at) <= abs(best-at)) {
			best = i
		}
	}
	if best < 0 {
		return g0, gn, false
	}
	return r.Growth[best], r.Growth[at], true
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}

// all are the rows of the run in print order.
func (r *Results) all() []*Row {
	rows := []*Row{r.Limit, r.LimitAgain, r.LimitOne, r.Consumer, r.ConsumerNoRelay, r.ConsumerOne, r.ConsumerBare, r.ConsumerBareDelete}
	rows = append(rows, r.Brokers...)
	rows = append(rows, r.Receiver, r.ReceiverOne, r.Naive,
		r.Relay, r.RelayLatency, r.RelayUnderLoad)
	rows = append(rows, r.Peers...)
	for _, g := range r.Growth {
		rows = append(rows, g.Limit, g.LimitClaim, g.Consumer, g.Receiver, g.Naive)
	}
	rows = append(rows, r.PruneSteady, r.PruneOff)
	rows = append(rows, r.Amplification...)
	rows = append(rows, r.Drop)
	out := rows[:0]
	for _, row := range rows {
		if row != nil {
			out = append(out, row)
		}
	}
	return out
}

// idemdRows are the rows of the run that measured idemd: all but its baselines' (the bare
// consumer, the naive receiver, the peers), whose memory is not idemd's.
func (r *Results) idemdRows() []*Row {
	others := map[*Row]bool{r.ConsumerBare: true, r.ConsumerBareDelete: true, r.Naive: true,
		r.PeersWatermill: true, r.PeersKafkaGo: true}
	for _, g := range r.Growth {
		others[g.Naive] = true
	}
	var rows []*Row
	for _, row := range r.all() {
		if !others[row] {
			rows = append(rows, row)
		}
	}
	return rows
}

// figure prints a ratio or a latency with two decimals, and one under 0.01 with two
// significant digits: the Pub/Sub fake's rate over the limit's (0.0033) printed as 0.00.
func figure(v float64) string {
	if v != 0 && math.Abs(v) < 0.01 {
		return strconv.FormatFloat(v, 'g', 2, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

func human(n int) string {
	switch {
	case n >= 1000000 && n%1000000 == 0:
		return fmt.Sprintf("%d M", n/1000000)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%d k", n/1000)
	}
	return fmt.Sprint(n)
}

func (r *Results) print(w io.Writer) {
	r.Ratios = r.ratios()
	m := r.Machine
	fmt.Fprintf(w, "idemd-bench  %s  %d CPUs (GOMAXPROCS %d), %d MiB RAM, %s, load average at start %s\n", m.Started, m.CPUs, m.GOMAXPROCS, m.MemoryMB, m.GoVersion, m.LoadAvg)
	fmt.Fprintf(w, "PostgreSQL %s (fsync=%s, synchronous_commit=%s, shared_buffers=%s, autovacuum=%s); Kafka: %s; children %s\n\n",
		m.PostgreSQL, m.Fsync, m.SynchronousCommit, m.SharedBuffers, m.Autovacuum, m.Broker, m.ChildGC)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "section\tmode\tcount\tseconds\trate\tunit\tp50 ms\tp99 ms\tp999 ms\tpeak RSS MiB\tCPU µs/msg idemd / pg / gen\t")
	for _, row := range r.all() {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.2f\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t\n", row.Section, row.Mode, row.Count, row.Seconds, row.Rate, row.Unit,
			opt(row.P50ms), opt(row.P99ms), opt(row.P999ms), opt(row.PeakRSSMiB), row.CPU)
	}
	_ = tw.Flush()
	if rows := r.withWork(); len(rows) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "PostgreSQL's work per message\tmode\tWAL bytes\tWAL records\tfull-page images\tbuffers\tbuffers read\trows written\t")
		for _, row := range rows {
			fmt.Fprintf(tw, "%s\t%s\t%s\t\n", row.Section, row.Mode, row.Work)
		}
		_ = tw.Flush()
	}
	if len(r.PruneSizes) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "prune (MiB)\tmsgs/s\tdedup rows\tunexpired\tepochs held\tdead\theap\tpkey\texpires_at idx\ttotal\tvacuums\toutbox rows\tdead\theap\ttotal\tvacuums\tboth\tbytes/dedup row\t\t")
		for _, s := range r.PruneSizes {
			both := s.ProcessedTotalMiB + s.OutboxTotalMiB
			fmt.Fprintf(tw, "%s\t%.0f\t%d\t%d\t%d\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%d\t%d\t%d\t%.1f\t%.1f\t%d\t%.1f\t%s\t%s\t\n", s.When, s.Rate,
				s.ProcessedRows, s.ProcessedUnexpired, s.ProcessedEpochsHeld, s.ProcessedDead, s.ProcessedHeapMiB, s.ProcessedPKeyMiB, s.ProcessedExpMiB, s.ProcessedTotalMiB, s.ProcessedVacuums,
				s.OutboxRows, s.OutboxDead, s.OutboxHeapMiB, s.OutboxTotalMiB, s.OutboxVacuums, both, perRow(both, s.ProcessedRows), sampleRole(s))
		}
		_ = tw.Flush()
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tvalue\tgoal\tmet")
	for _, ra := range r.Ratios {
		met := "yes"
		if !ra.Met {
			met = "NO"
		}
		if ra.Goal == "(info)" {
			met = ""
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", ra.Name, figure(ra.Value), ra.Goal, met)
	}
	_ = tw.Flush()
	var notes []string
	for _, row := range r.all() {
		if row.Note != "" {
			notes = append(notes, fmt.Sprintf("  %s (%s): %s", row.Section, row.Mode, row.Note))
		}
	}
	for _, n := range r.Notes {
		notes = append(notes, "  "+n)
	}
	if len(r.withWork()) > 0 {
		notes = append(notes, "  PostgreSQL's work per message: counted from the load's start until its connections closed, from the server's WAL position and pg_stat_wal (all of the server's WAL: nothing else writes meanwhile) and the bench database's pg_stat_database (buffers read or hit in shared buffers, and since phase 34 those read, not found there; rows inserted, updated and deleted); unlike rates and CPU these move only with what the statements do, except the full-page images (and so WAL bytes), which depend on how long ago the last checkpoint was")
	}
	notes = append(notes, "  CPU µs/msg: CPU time per message of the idemd child, of the PostgreSQL backends serving it (shared WAL writing and checkpoints not counted) and of the bench process (load generator and in-process broker); for limit and amplification rows, of the limit's pgx client and its backends")
	if len(notes) > 0 {
		fmt.Fprintln(w, "\nnotes:\n"+strings.Join(notes, "\n"))
	}
}

// withWork are the rows with PostgreSQL's work counted, in the order of the main table.
func (r *Results) withWork() []*Row {
	var out []*Row
	for _, row := range r.all() {
		if row.Work != nil {
			out = append(out, row)
		}
	}
	return out
}

// perRow is size MiB over rows, in bytes per row ("-" without rows).
func perRow(mib float64, rows int64) string {
	if rows == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", mib*(1<<20)/float64(rows))
}

func opt(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", v)
}

func quote(schema string) string { return pgx.Identifier{schema}.Sanitize() }

// sampleRole labels a prune sample with its half of the steady state and its window.
func sampleRole(s Sizes) string {
	h := ""
	if s.Half > 0 {
		h = fmt.Sprintf("half %d", s.Half)
	}
	if s.Role != "" && h != "" {
		return h + ", " + s.Role
	}
	return h + s.Role
}

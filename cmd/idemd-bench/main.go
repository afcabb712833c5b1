// Command idemd-bench measures idemd on one machine, against the local PostgreSQL and an
// in-process Kafka-protocol broker (kfake) or IDEMD_KAFKA_BROKERS, and prints every figure
// beside its baseline from the same run: the same SQL done directly through pgx (the
// limit), the consumer, the receiver, the relay, and the peak RSS of idemd under each load.
//
// The idemd side of each load runs in a child process (this binary re-executed with the
// hidden -serve flag), so that its peak RSS (VmHWM) does not count the load generator's
// memory; the parent generates the load and measures.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/idemd/idemd/internal/gctune"
	"github.com/idemd/idemd/outbox"
	"github.com/idemd/idemd/processed"
)

// options are the command-line flags of a bench run.
type options struct {
	messages    int
	messagesOne int
	partitions  int
	batch       int
	// inFlight is the consumer's BatchesInFlight (0: its default).
	inFlight       int
	limitBatches   []int
	limitWorkers   []int
	duration       time.Duration
	durationOne    time.Duration
	concurrency    int
	maxBatch       int
	linger         time.Duration
	receiverConns  int
	receiverTurns  int
	relayEvents    int
	relayBatch     int
	relayRate      int
	relayDuration  time.Duration
	peersBin       string
	peerMessages   int
	peerPartitions int
	growthRows     []int
	growthMessages int
	// growthRounds is how many rounds of the limit and the consumer each growth point runs.
	growthRounds int
	// growthEpochs is how many epochs the growth pre-fill spreads its rows over, by age.
	growthEpochs   int
	dropRows       int
	dropDuration   time.Duration
	pruneRetention time.Duration
	prunePeriods   int
	pruneInterval  time.Duration
	pruneNaptime   time.Duration
	// prunePartitions is the prune section's IDEMD_PROCESSED_PARTITION_INTERVAL (0: rows),
	// auto resolved.
	prunePartitions time.Duration
	pruneVacClock   bool
	brokerMessages  int
	pubsubMessages  int
	sqsPollers      []int
	brokerDoors     string
	only            string
	jsonOut         bool
	profileDir      string
	keepSchema      bool
	keepPublished   bool
	noHandoff       bool
	noFilter        bool
	relayPool       bool
	childEnv        string
	databaseURL     string
	brokers         string
}

var sections = []string{"limit", "consumer", "brokers", "receiver", "relay", "peers", "growth", "prune", "drop", "amplification"}

// defaultSections run without -only; the slow ones are asked for by name.
var defaultSections = []string{"limit", "consumer", "brokers", "receiver", "relay", "peers", "growth", "prune", "drop", "amplification"}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("idemd-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.IntVar(&o.messages, "messages", 100000, "messages pre-produced for the batched consumer and the batched limit (20% of them duplicates for the consumer)")
	fs.IntVar(&o.messagesOne, "messages-one", 4000, "messages for the one-transaction-per-message consumer and limit")
	fs.IntVar(&o.partitions, "partitions", 4, "partitions of the consumer and relay topics; also the limit's concurrent workers")
	fs.IntVar(&o.batch, "batch", 500, "consumer BatchSize (records per transaction)")
	fs.IntVar(&o.inFlight, "in-flight", 0, "consumer BatchesInFlight: the Kafka door's workers, over which a member's partitions are dealt, each applying batches that may span its partitions; the bare consumer's workers too (0: the consumer's default, 4)")
	limitBatches := fs.String("limit-batches", "100,500,1000", "batch sizes (messages per transaction) the limit tries with each method")
	limitWorkers := fs.String("limit-workers", "2,4,8", "worker counts the limit's best method and batch size is tried with")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "how long the receiver is loaded with group commit")
	fs.DurationVar(&o.durationOne, "duration-one", 5*time.Second, "how long the receiver is loaded with one transaction per request")
	fs.IntVar(&o.concurrency, "concurrency", 64, "concurrent keep-alive connections sending webhooks")
	fs.IntVar(&o.maxBatch, "max-batch", 128, "receiver MaxBatch (group commit)")
	fs.DurationVar(&o.linger, "linger", 0, "receiver Linger (0: its default; negative: none)")
	fs.IntVar(&o.receiverConns, "receiver-conns", 8, "PostgreSQL connections of the receiver (its concurrent transactions)")
	fs.IntVar(&o.receiverTurns, "receiver-turns", 4, "turns each of the group-committed and the naive receiver is loaded for, in turns with the other, within -duration")
	fs.IntVar(&o.relayEvents, "relay-events", 50000, "outbox rows pre-filled for the relay throughput run")
	fs.IntVar(&o.relayBatch, "relay-batch", outbox.RelayBatchSizeDefault, "relay BatchSize (the daemon's default; 1000 before phase 22)")
	fs.IntVar(&o.relayRate, "relay-rate", 1000, "events/s enqueued, one per transaction, for the commit-to-Kafka latency run")
	fs.DurationVar(&o.relayDuration, "relay-duration", 10*time.Second, "length of the relay latency run")
	fs.StringVar(&o.peersBin, "peers-bin", "", "the peer consumers' program (build: go build -C bench/peers -o idemd-peers .); without it the peers section is skipped")
	fs.IntVar(&o.peerMessages, "peer-messages", 72000, "records of the peer comparison topic (20% duplicates)")
	fs.IntVar(&o.peerPartitions, "peer-partitions", 6, "partitions of the peer comparison topic")
	growthRows := fs.String("growth-rows", "0,1000000", "sizes to pre-fill processed_messages and the published outbox to before measuring the limit, the consumer and the receivers (comma list; 10000000 takes about 12 minutes on a 2-core machine: the ids go in random key order, as traffic inserts them)")
	fs.IntVar(&o.growthMessages, "growth-messages", 100000, "records consumed (and limit messages) at each growth size")
	fs.IntVar(&o.growthRounds, "growth-rounds", 3, "rounds at each growth size, each the limit's strongest form and the consumer back to back on fresh ids; the growth goal compares the medians of their ratios")
	fs.IntVar(&o.growthEpochs, "growth-epochs", processed.EpochsPerRetention+1, "epochs (partitions of processed_messages) the growth pre-fill spreads its rows over by age, as the daemon's default IDEMD_PROCESSED_PARTITION_INTERVAL (auto: the retention) leaves them: the current one and the one before, probed by a new id's claim (5 for a quarter of the retention, phase 27's default); 1 puts every row in the current one, as before phase 28")
	fs.IntVar(&o.dropRows, "drop-rows", 2000000, "expired records in the epoch the drop section drops (an epoch of the default 7 days holds this many at about 3.3 messages/s, 10 M at 16.5)")
	fs.DurationVar(&o.dropDuration, "drop-duration", 15*time.Second, "how long the drop section loads the receiver at -relay-rate webhooks/s; the drop starts a third of the way in")
	fs.DurationVar(&o.pruneRetention, "prune-retention", 10*time.Second, "the prune section's pipeline retention (and outbox retention): rows expire and are pruned all along its run")
	fs.IntVar(&o.prunePeriods, "prune-periods", 48, "how many retention periods the prune section's steady state lasts (at least 7; the largest sizes of its second half are compared with those of its first half from three periods in; 24 before phase 22, over which the primary key may not have levelled off yet: BENCHMARKS.md, phases 16 and 22)")
	fs.DurationVar(&o.pruneInterval, "prune-interval", time.Second, "the prune section's pruner interval (the daemon's IDEMD_PRUNE_INTERVAL, 1m by default for 7 days of retention)")
	partitions := autoDuration{auto: true}
	fs.Var(&partitions, "prune-partition-interval", "the prune section's IDEMD_PROCESSED_PARTITION_INTERVAL: prune dedup records by dropping epochs opened this often, auto (-prune-retention, as the daemon's auto; a quarter of it before phase 28) or 0 (row by row)")
	fs.DurationVar(&o.pruneNaptime, "prune-naptime", time.Second, "how often the prune section's autovacuum emulation looks at the tables (autovacuum_naptime, 1min on a server)")
	fs.BoolVar(&o.pruneVacClock, "prune-vacuum-clock", true, "the autovacuum emulation's cost-based sleeps are compressed as its naptime is (the server's autovacuum_naptime / -prune-naptime: 2 ms / 60 by default); false sleeps the server's autovacuum_vacuum_cost_delay, as before phase 7")
	fs.IntVar(&o.brokerMessages, "broker-messages", 20000, "messages published to each Pub/Sub subscription and SQS queue of the brokers section (20% of them repeats: new broker messages with an earlier operation-id)")
	fs.IntVar(&o.pubsubMessages, "pubsub-messages", 2000, "messages of the Pub/Sub runs of the brokers section (pstest delivers about 100 messages/s per streaming pull: see BENCHMARKS.md)")
	fs.StringVar(&o.brokerDoors, "broker-doors", "pubsub,sqs", "doors the brokers section measures: pubsub, sqs or both")
	sqsPollers := fs.String("sqs-pollers", "1,8", "concurrent ReceiveMessage pollers of the broker-only SQS client (comma list; the fastest is its baseline)")
	fs.StringVar(&o.only, "only", "", "comma list of sections to run: "+strings.Join(sections, ",")+" (default all)")
	fs.BoolVar(&o.jsonOut, "json", false, "print the results as JSON instead of a table")
	fs.StringVar(&o.profileDir, "profile-dir", "", "write CPU, heap, allocation and block profiles of each idemd child process into this directory, and a CPU profile of the bench process (load generator and in-process broker) over each consumer run (loadgen-*)")
	fs.BoolVar(&o.keepSchema, "keep-schema", false, "do not drop the bench schema at the end (inspection)")
	fs.StringVar(&o.childEnv, "child-env", "", "comma list of NAME=VALUE added to the environment of every idemd child only (not the bench's, not the peers'), e.g. GOGC=300,GOMEMLIMIT=120MiB to measure the daemon under the Go runtime's settings")
	fs.BoolVar(&o.noFilter, "no-filter", false, "run the consumer and the receiver without the filter of the older epochs' ids (processed.EpochFilter, IDEMD_PROCESSED_FILTER_MAX_BYTES=0): every new id is looked up in the older epochs, as before phase 30")
	fs.BoolVar(&o.noHandoff, "no-handoff", false, "run the relay without the Handoff of its process's doors (outbox.Handoff): it reads every row back from the table, as before phase 15")
	fs.BoolVar(&o.relayPool, "relay-pool", false, "give the relay of each idemd child a pool of its own, whose PostgreSQL backends' CPU is shown apart (\"relay\" in the CPU column, counted in pg too); the daemon's relay shares the doors' pool")
	fs.BoolVar(&o.keepPublished, "keep-published", false, "run the relay with KeepPublished (IDEMD_OUTBOX_KEEP_PUBLISHED: published rows kept, moved to outbox_published), and pre-fill published outbox rows for growth")
	fs.StringVar(&o.databaseURL, "database-url", "", "PostgreSQL URL (default IDEMD_DATABASE_URL, else "+databaseURLDefault+")")
	fs.StringVar(&o.brokers, "brokers", "", "Kafka brokers, comma list (default IDEMD_KAFKA_BROKERS, else an in-process kfake broker)")
	var serve, serveConfig string
	fs.StringVar(&serve, "serve", "", "internal: run the idemd side of a load (child process)")
	fs.StringVar(&serveConfig, "serve-config", "", "internal: the child's configuration, JSON")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: idemd-bench [flags]

Measures idemd's throughput, latency and memory on this machine, each figure beside its
baseline from the same run, and prints a table (or JSON with -json):

  limit          the consumer's database work on the same records (dedup insert, effect
                 insert, outbox insert per new id) done as fast as the bench knows through
                 pgx: pipelined statements, unnest arrays and COPY, at -limit-batches and
                 -limit-workers; the fastest is the limit;
  consumer       exactly-once messages/s over -messages pre-produced records with 20%%
                 duplicates, with the relay running (as in production), without it, and
                 with one transaction per message; and the bare consumer (kafka-go as
                 idemd reads, the limit's unnest writes, events published after each
                 commit, none of idemd's other work): how close any consumer came;
  brokers        idemd's Pub/Sub and SQS subscriptions on in-process fakes (pstest,
                 goaws) over -broker-messages (SQS) and -pubsub-messages messages with 20%% repeats, each beside
                 the limit and beside the official client receiving and acknowledging
                 the same messages with no database (-sqs-pollers);
  receiver       Stripe-signed webhooks/s at -concurrency keep-alive connections with
                 p50/p99/p999 latency: idemd with MaxBatch 1, then idemd with group
                 commit and a naive net/http receiver with one transaction per request,
                 side by side and loaded in turns (-receiver-turns each, A B B A…)
                 after 1 s of warm-up each, not counted;
  relay          drain rate of a pre-filled outbox, commit-to-Kafka latency at
                 -relay-rate events/s, and 2xx-to-record latency with the receiver taking
                 -relay-rate webhooks/s (after 1 s of warm-up at that rate, reported apart);
  peers          idemd, idiomatic Watermill and a hand-written kafka-go consumer on one
                 topic (-peer-messages, -peer-partitions); needs -peers-bin;
  growth         the limit and the consumer (-growth-rounds rounds of the two back to
                 back; the goal compares the medians of their ratios), then the
                 receiver and the naive receiver in turns (rate and p99), on tables
                 pre-filled to each -growth-rows (emptied before each run at 0 rows),
                 spread over -growth-epochs epochs as the daemon's default leaves them;
  prune          the consumer, relay and pruner running at full speed (the rate they
                 sustain together: the producer counts the outbox rows waiting for the
                 relay) for -prune-periods periods of a -prune-retention retention (rows
                 expire and are pruned all along), VACUUM where autovacuum would
                 (-prune-naptime, -prune-vacuum-clock); table and index sizes every half
                 period, the largest of the second half against the largest of the
                 first (from three periods in); then the consumer without the pruner on
                 the same tables;
  drop           the receiver at -relay-rate webhooks/s while the pruner drops an
                 expired epoch of -drop-rows records (an epoch at production size):
                 the latency of the webhooks due during the drop, from their due time;
  amplification  the limit with the relay's delete at publish beside it, with the move
                 of published rows to outbox_published (keep published) instead, and
                 with a lean dedup row, and with an outbox partitioned by id whose
                 published rows stay behind a watermark, to go with their partition
                 (no delete): what a schema change would buy; on a
                 server with wal_level=logical, also with each event written as a
                 logical decoding message instead of an outbox row, the slot read
                 after the run and read beside it (a logical-decoding relay's cost);
  RSS            peak resident memory (VmHWM) of the idemd child process under each load.

Every child (idemd's, the bare consumer's, the naive receiver's) runs with the daemon's
collector setting, GOGC=200, unless GOGC is in the environment or in -child-env.

PostgreSQL: -database-url, IDEMD_DATABASE_URL, or the local server; the run uses a fresh
schema, dropped at the end. Kafka: -brokers, IDEMD_KAFKA_BROKERS, or an in-process broker.

Flags:
`)
		fs.VisitAll(func(f *flag.Flag) {
			if strings.HasPrefix(f.Name, "serve") {
				return
			}
			name, usage := flag.UnquoteUsage(f)
			fmt.Fprintf(fs.Output(), "  -%s %s\n    \t%s", f.Name, name, usage)
			if f.DefValue != "" && f.DefValue != "false" {
				fmt.Fprintf(fs.Output(), " (default %s)", f.DefValue)
			}
			fmt.Fprintln(fs.Output())
		})
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "idemd-bench: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	o.prunePartitions = partitions.d
	if partitions.auto {
		o.prunePartitions = o.pruneRetention / processed.EpochsPerRetention
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if serve != "" {
		// Every child, idemd's and the baselines' (the bare consumer, the naive receiver),
		// runs with the daemon's collector setting, unless -child-env sets GOGC.
		gctune.DefaultFromEnv()
		if err := serveChild(ctx, serve, serveConfig, stdout); err != nil {
			fmt.Fprintf(stderr, "idemd-bench --serve=%s: %v\n", serve, err)
			return 1
		}
		return 0
	}
	var perr error
	if o.limitBatches, perr = intList(*limitBatches); perr != nil {
		fmt.Fprintf(stderr, "idemd-bench: -limit-batches: %v\n", perr)
		return 2
	}
	if o.limitWorkers, perr = intList(*limitWorkers); perr != nil {
		fmt.Fprintf(stderr, "idemd-bench: -limit-workers: %v\n", perr)
		return 2
	}
	if o.sqsPollers, perr = intList(*sqsPollers); perr != nil {
		fmt.Fprintf(stderr, "idemd-bench: -sqs-pollers: %v\n", perr)
		return 2
	}
	if o.growthRows, perr = intList(*growthRows); perr != nil {
		fmt.Fprintf(stderr, "idemd-bench: -growth-rows: %v\n", perr)
		return 2
	}
	if err := o.validate(); err != nil {
		fmt.Fprintf(stderr, "idemd-bench: %v\n", err)
		return 2
	}
	res, err := bench(ctx, &o, stderr)
	if res != nil {
		res.Ratios = res.ratios()
		if o.jsonOut {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			_ = enc.Encode(res)
		} else {
			res.print(stdout)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "idemd-bench: %v\n", err)
		return 1
	}
	return 0
}

func (o *options) validate() error {
	for _, s := range o.selected() {
		if !slices.Contains(sections, s) {
			return fmt.Errorf("-only: unknown section %q (known: %s)", s, strings.Join(sections, ","))
		}
	}
	switch {
	case o.messages < 1, o.messagesOne < 1, o.relayEvents < 1:
		return errors.New("-messages, -messages-one and -relay-events must be positive")
	case o.brokerMessages < 1, o.pubsubMessages < 1, len(o.sqsPollers) == 0, slices.ContainsFunc(o.sqsPollers, nonPositive):
		return errors.New("-broker-messages, -pubsub-messages and -sqs-pollers must be positive")
	case o.partitions < 1, o.batch < 1, o.maxBatch < 1, o.relayBatch < 1, o.peerPartitions < 1, o.peerMessages < 1, o.growthMessages < 1, o.growthEpochs < 1, o.growthRounds < 1:
		return errors.New("-partitions, -batch, -max-batch, -relay-batch, -peer-partitions, -peer-messages, -growth-messages, -growth-epochs and -growth-rounds must be positive")
	case slices.ContainsFunc(o.limitBatches, nonPositive), slices.ContainsFunc(o.limitWorkers, nonPositive), len(o.limitBatches) == 0:
		return errors.New("-limit-batches and -limit-workers must be positive numbers")
	case slices.ContainsFunc(o.growthRows, func(n int) bool { return n < 0 }):
		return errors.New("-growth-rows must not be negative")
	case o.prunePeriods < 7, o.pruneRetention < 2*time.Second, o.pruneInterval <= 0, o.pruneNaptime <= 0:
		return errors.New("-prune-periods must be at least 7, -prune-retention at least 2s, -prune-interval and -prune-naptime positive")
	case o.concurrency < 1, o.receiverConns < 1, o.relayRate < 1, o.receiverTurns < 1:
		return errors.New("-concurrency, -receiver-conns, -receiver-turns and -relay-rate must be positive")
	case o.duration <= 0, o.durationOne <= 0, o.relayDuration <= 0, o.dropDuration <= 0, o.dropRows < 1:
		return errors.New("-duration, -duration-one, -relay-duration, -drop-duration and -drop-rows must be positive")
	case o.receiverConns > 16:
		return errors.New("-receiver-conns: at most 16 (the database is shared; the bench stays under 30 connections)")
	}
	if o.childEnv != "" {
		for _, kv := range strings.Split(o.childEnv, ",") {
			if name, _, ok := strings.Cut(kv, "="); !ok || name == "" {
				return fmt.Errorf("-child-env: %q is not NAME=VALUE", kv)
			}
		}
	}
	return nil
}

func nonPositive(n int) bool { return n < 1 }

// intList parses a comma list of integers.
func intList(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

func (o *options) selected() []string {
	if o.only == "" {
		return defaultSections
	}
	var out []string
	for s := range strings.SplitSeq(o.only, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func (o *options) want(section string) bool { return slices.Contains(o.selected(), section) }

// bench runs the selected sections in order and returns what it measured, even when a
// later section failed.
func bench(ctx context.Context, o *options, logw io.Writer) (*Results, error) {
	e, err := newEnv(ctx, o, logw)
	if err != nil {
		return nil, err
	}
	defer e.close()
	res := &Results{Machine: e.machine(ctx), Options: o.public()}
	res.Machine.GOMAXPROCS = runtime.GOMAXPROCS(0)
	steps := []struct {
		name string
		fn   func(context.Context, *env, *Results) error
	}{
		{"limit", benchLimit},
		{"consumer", benchConsumer},
		{"brokers", benchBrokers},
		{"receiver", benchReceiver},
		{"relay", benchRelay},
		{"relay", benchRelayUnderLoad},
		{"peers", benchPeers},
		{"growth", benchGrowth},
		{"prune", benchPrune},
		{"drop", benchDrop},
		{"amplification", benchAmplification},
	}
	for _, s := range steps {
		if !o.want(s.name) {
			continue
		}
		e.logf("== %s", s.name)
		began := time.Now()
		if err := s.fn(ctx, e, res); err != nil {
			return res, fmt.Errorf("%s: %w", s.name, err)
		}
		e.logf("== %s done in %s", s.name, time.Since(began).Round(time.Millisecond))
	}
	return res, nil
}

// autoDuration is a flag taking auto or a duration (0 and up).
type autoDuration struct {
	auto bool
	d    time.Duration
}

func (a *autoDuration) String() string {
	if a.auto {
		return "auto"
	}
	return a.d.String()
}

func (a *autoDuration) Set(s string) error {
	if s == "auto" {
		*a = autoDuration{auto: true}
		return nil
	}
	d, err := time.ParseDuration(s)
	if err == nil && d < 0 {
		err = errors.New("negative")
	}
	if err != nil {
		return fmt.Errorf("%q is not auto or a duration of 0 or more", s)
	}
	*a = autoDuration{d: d}
	return nil
}

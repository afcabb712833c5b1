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
	"strings"
	"syscall"
	"time"
)

// options are the command-line flags of a bench run.
type options struct {
	messages      int
	messagesOne   int
	partitions    int
	batch         int
	limitBatch    int
	duration      time.Duration
	durationOne   time.Duration
	concurrency   int
	maxBatch      int
	receiverConns int
	relayEvents   int
	relayBatch    int
	relayRate     int
	relayDuration time.Duration
	only          string
	jsonOut       bool
	profileDir    string
	keepSchema    bool
	databaseURL   string
	brokers       string
}

var sections = []string{"limit", "consumer", "receiver", "relay"}

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
	fs.IntVar(&o.batch, "batch", 500, "consumer BatchSize (records of one partition per transaction)")
	fs.IntVar(&o.limitBatch, "limit-batch", 100, "messages per transaction of the batched limit")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "how long the receiver is loaded with group commit")
	fs.DurationVar(&o.durationOne, "duration-one", 5*time.Second, "how long the receiver is loaded with one transaction per request")
	fs.IntVar(&o.concurrency, "concurrency", 64, "concurrent keep-alive connections sending webhooks")
	fs.IntVar(&o.maxBatch, "max-batch", 128, "receiver MaxBatch (group commit)")
	fs.IntVar(&o.receiverConns, "receiver-conns", 8, "PostgreSQL connections of the receiver (its concurrent transactions)")
	fs.IntVar(&o.relayEvents, "relay-events", 50000, "outbox rows pre-filled for the relay throughput run")
	fs.IntVar(&o.relayBatch, "relay-batch", 1000, "relay BatchSize")
	fs.IntVar(&o.relayRate, "relay-rate", 1000, "events/s enqueued, one per transaction, for the commit-to-Kafka latency run")
	fs.DurationVar(&o.relayDuration, "relay-duration", 10*time.Second, "length of the relay latency run")
	fs.StringVar(&o.only, "only", "", "comma list of sections to run: "+strings.Join(sections, ",")+" (default all)")
	fs.BoolVar(&o.jsonOut, "json", false, "print the results as JSON instead of a table")
	fs.StringVar(&o.profileDir, "profile-dir", "", "write CPU, heap, allocation and block profiles of each idemd child process into this directory")
	fs.BoolVar(&o.keepSchema, "keep-schema", false, "do not drop the bench schema at the end (inspection)")
	fs.StringVar(&o.databaseURL, "database-url", "", "PostgreSQL URL (default IDEMD_DATABASE_URL, else "+databaseURLDefault+")")
	fs.StringVar(&o.brokers, "brokers", "", "Kafka brokers, comma list (default IDEMD_KAFKA_BROKERS, else an in-process kfake broker)")
	var serve, serveConfig string
	fs.StringVar(&serve, "serve", "", "internal: run the idemd side of a load (child process)")
	fs.StringVar(&serveConfig, "serve-config", "", "internal: the child's configuration, JSON")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: idemd-bench [flags]

Measures idemd's throughput, latency and memory on this machine, each figure beside its
baseline from the same run, and prints a table (or JSON with -json):

  limit     the consumer's SQL work (dedup insert, effect insert, outbox insert) done
            directly through pgx: batched (-limit-batch per transaction) and one message
            per transaction;
  consumer  exactly-once messages/s over -messages pre-produced records with 20%%
            duplicates, and with one transaction per message (BatchSize 1);
  receiver  Stripe-signed webhooks/s at -concurrency keep-alive connections, with
            p50/p99/p999 latency, group-committed and with one transaction per request;
  relay     events/s from a pre-filled outbox to Kafka (acks=all), and commit-to-Kafka
            latency at a steady -relay-rate events/s;
  RSS       peak resident memory (VmHWM) of the idemd child process under each load.

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
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if serve != "" {
		if err := serveChild(ctx, serve, serveConfig, stdout); err != nil {
			fmt.Fprintf(stderr, "idemd-bench --serve=%s: %v\n", serve, err)
			return 1
		}
		return 0
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
	case o.partitions < 1, o.batch < 1, o.limitBatch < 1, o.maxBatch < 1, o.relayBatch < 1:
		return errors.New("-partitions, -batch, -limit-batch, -max-batch and -relay-batch must be positive")
	case o.concurrency < 1, o.receiverConns < 1, o.relayRate < 1:
		return errors.New("-concurrency, -receiver-conns and -relay-rate must be positive")
	case o.duration <= 0, o.durationOne <= 0, o.relayDuration <= 0:
		return errors.New("-duration, -duration-one and -relay-duration must be positive")
	case o.receiverConns > 16:
		return errors.New("-receiver-conns: at most 16 (the database is shared; the bench stays under 30 connections)")
	}
	return nil
}

func (o *options) selected() []string {
	if o.only == "" {
		return sections
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
		{"receiver", benchReceiver},
		{"relay", benchRelay},
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

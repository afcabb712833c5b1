package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/sirupsen/logrus"

	"github.com/idemd/idemd/consumer"
	"github.com/idemd/idemd/internal/brokerenv"
	"github.com/idemd/idemd/internal/metrics"
	"github.com/idemd/idemd/internal/pgarray"
	"github.com/idemd/idemd/internal/pgpool"
	"github.com/idemd/idemd/internal/problemconn"
	"github.com/idemd/idemd/outbox"
	"github.com/idemd/idemd/pipeline"
	"github.com/idemd/idemd/processed"
	"github.com/idemd/idemd/receiver"
)

// childConfig is what the parent tells a child (the -serve-config flag, JSON).
type childConfig struct {
	URL string `json:"url"`
	// AppName is the application_name of the child's connections (CPU accounting).
	AppName     string   `json:"app_name"`
	Schema      string   `json:"schema"`
	Brokers     []string `json:"brokers"`
	MaxConns    int32    `json:"max_conns"`
	Topic       string   `json:"topic,omitempty"`
	Group       string   `json:"group,omitempty"`
	OutboxTopic string   `json:"outbox_topic,omitempty"`
	Batch       int      `json:"batch,omitempty"`
	// InFlight is the consumer's BatchesInFlight (0: its default).
	InFlight int    `json:"in_flight,omitempty"`
	Secret   string `json:"secret,omitempty"`
	// Source is the receiver's (and the naive receiver's) source name, its dedup scope and
	// its path /webhooks/{Source}; "" is defaultSource.
	Source string `json:"source,omitempty"`
	// Linger is the receiver's (0: its default).
	Linger      time.Duration `json:"linger,omitempty"`
	ProfileDir  string        `json:"profile_dir,omitempty"`
	ProfileName string        `json:"profile_name,omitempty"`
	// Relay runs the outbox relay in the same process (as the daemon does), with
	// RelayBatch rows per round; Prune runs the pruner every PruneInterval (0: every
	// second), deleting published outbox rows after OutboxRetention (0: the daemon's 24 h).
	Relay      bool `json:"relay,omitempty"`
	RelayBatch int  `json:"relay_batch,omitempty"`
	// KeepPublished is the relay's (-keep-published).
	KeepPublished bool `json:"keep_published,omitempty"`
	// RelayPool gives the relay a pool of its own, its connections' application_name
	// AppName + relayAppSuffix (-relay-pool).
	RelayPool bool `json:"relay_pool,omitempty"`
	// NoHandoff runs the relay without the Handoff (-no-handoff): it reads back every row.
	NoHandoff bool `json:"no_handoff,omitempty"`
	// NoFilter runs the consumer and the receiver without the filter of the older epochs'
	// ids (-no-filter): every new id is looked up in them.
	NoFilter      bool          `json:"no_filter,omitempty"`
	Prune         bool          `json:"prune,omitempty"`
	PruneInterval time.Duration `json:"prune_interval,omitempty"`
	// PartitionInterval, when positive, prunes dedup records by epochs opened this often
	// (the daemon's IDEMD_PROCESSED_PARTITION_INTERVAL) instead of row by row.
	PartitionInterval time.Duration `json:"partition_interval,omitempty"`
	OutboxRetention   time.Duration `json:"outbox_retention,omitempty"`
	// Retention is the consumer's (consumer.Config.Retention; 0: its default, 7 days).
	Retention time.Duration `json:"retention,omitempty"`
	// PubSubSubscription or SQSQueue, when set, is what the consumer reads instead of Topic
	// (the brokers section), with the clients idemd builds from BrokerEnv (the variables
	// of internal/brokerenv: the fakes' addresses), the message id in the attribute
	// IDAttribute, and Lease as consumer.Config.Lease (0: its default).
	PubSubSubscription string            `json:"pubsub_subscription,omitempty"`
	SQSQueue           string            `json:"sqs_queue,omitempty"`
	BrokerEnv          map[string]string `json:"broker_env,omitempty"`
	IDAttribute        string            `json:"id_attribute,omitempty"`
	Lease              time.Duration     `json:"lease,omitempty"`
	// BareDelete makes the bare consumer delete its outbox rows once published (bare.go).
	BareDelete bool `json:"bare_delete,omitempty"`
}

// relayAppSuffix ends the application_name of a relay's pool of its own (-relay-pool).
const relayAppSuffix = "-relay"

// effectSQL is the effect of every pipeline of the bench: one row per applied message.
const effectSQL = `INSERT INTO %s.effects (message_id, payload, topic, part, off)
VALUES (@message_id, @payload::jsonb, @topic, @partition, @offset)`

// serveChild runs the idemd side of one load until its stdin closes, then drains and
// returns. It prints "ready [detail]" on stdout once the load may start.
func serveChild(ctx context.Context, kind, raw string, stdout io.Writer) error {
	var c childConfig
	if err := json.Unmarshal([]byte(raw), &c); err != nil {
		return fmt.Errorf("-serve-config: %w", err)
	}
	pcfg, err := pgxpool.ParseConfig(c.URL)
	if err != nil {
		return err
	}
	pcfg.MaxConns = max(c.MaxConns, 2)
	if c.AppName != "" {
		pcfg.ConnConfig.RuntimeParams["application_name"] = c.AppName
	}
	pcfg.AfterConnect = pgarray.AfterConnect
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	// Opened before "ready", as the daemon opens its pool before /readyz says ready.
	if failed, err := pgpool.Warm(ctx, pool); err != nil {
		return fmt.Errorf("opening %d of the pool's connections: %w", failed, err)
	}
	l := logrus.New()
	l.SetOutput(os.Stderr)
	l.SetLevel(logrus.WarnLevel)
	log := logrus.NewEntry(l)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The parent closes stdin to stop the child.
	go func() {
		_, _ = io.Copy(io.Discard, bufio.NewReader(os.Stdin))
		cancel()
	}()

	var (
		runFn  func(context.Context) error
		detail string
		after  func()
		door   string // the consumer's
	)
	q := quote(c.Schema)
	// parts run beside the door: the relay and the pruner, as in the daemon.
	var parts []func(context.Context) error
	var rel *outbox.Relay
	// As in the daemon, the door hands its committed rows to the relay of its process.
	var handoff *outbox.Handoff
	if c.Relay && !c.NoHandoff {
		handoff = outbox.NewHandoff()
	}
	if c.Relay || kind == "relay" {
		relayPool := pool
		if c.RelayPool {
			rcfg := pcfg.Copy()
			rcfg.MaxConns = 4
			rcfg.ConnConfig.RuntimeParams["application_name"] = c.AppName + relayAppSuffix
			if relayPool, err = pgxpool.NewWithConfig(ctx, rcfg); err != nil {
				return err
			}
			defer relayPool.Close()
			if failed, err := pgpool.Warm(ctx, relayPool); err != nil {
				return fmt.Errorf("opening %d of the relay pool's connections: %w", failed, err)
			}
		}
		rel, err = outbox.NewRelay(relayPool, &outbox.RelayConfig{
			Schema:        c.Schema,
			Brokers:       c.Brokers,
			BatchSize:     max(c.RelayBatch, c.Batch*boolInt(kind == "relay")),
			KeepPublished: c.KeepPublished,
			Handoff:       handoff,
			Logger:        log,
		})
		if err != nil {
			return err
		}
		after = func() {
			fmt.Fprintf(os.Stderr, "%s child: relay published %d records in %d rounds (%d of them handed over, with %d records and %d older records the check found; the handoff turned rows away %d times; %d handovers put back, %d ids between handed rows looked for; below them %d ids looked for, %d walks from the floor)\n", kind, rel.Published(), rel.Rounds(), rel.HandedRounds(), rel.HandedRows(), rel.HandoffOlderTaken(), handoffOverflows(handoff), rel.HandoffFallbacks(), rel.HandoffGapProbes(), rel.HandoffBelowProbes(), rel.HandoffBelowWalks())
		}
		if kind != "relay" {
			parts = append(parts, rel.Run)
		}
	}
	if c.Prune {
		prune, err := pruneLoop(pool, c.Schema, cmp.Or(c.PruneInterval, time.Second), c.PartitionInterval, cmp.Or(c.OutboxRetention, 24*time.Hour), log)
		if err != nil {
			return err
		}
		parts = append(parts, prune)
	}
	// The doors' filter of the older epochs' ids, built before "ready" as a daemon that
	// has run a while has it, then kept current beside them as the daemon does.
	var filter *processed.EpochFilter
	if (kind == "consumer" || kind == "receiver") && !c.NoFilter {
		filter = processed.NewEpochFilter(c.Schema, 0)
		res, err := filter.Refresh(ctx, pool)
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "%s child: filter of the older epochs' ids built under epoch %d in %s: %d ids\n", kind, res.Epoch, res.Took.Round(time.Millisecond), res.IDs)
		// The build's scan of the older epochs is not the load's work.
		idle := pool.AcquireAllIdle(ctx)
		err = reportCounters(ctx, idle...)
		for _, conn := range idle {
			conn.Release()
		}
		if err != nil {
			return err
		}
		parts = append(parts, func(ctx context.Context) error { return filter.Run(ctx, pool, 0, log, nil) })
	}
	switch kind {
	case "consumer":
		cfg := &consumer.Config{
			Name:            "bench",
			Brokers:         c.Brokers,
			Schema:          c.Schema,
			Effect:          consumer.Effect{SQL: fmt.Sprintf(effectSQL, q)},
			Publish:         pipeline.Targets{{Topic: c.OutboxTopic}},
			BatchSize:       c.Batch,
			BatchesInFlight: c.InFlight,
			Lease:           c.Lease,
			Retention:       c.Retention,
			Logger:          log,
			Handoff:         handoff,
			Filter:          filter,
		}
		clients := brokerenv.New(func(name string) (string, bool) { v, ok := c.BrokerEnv[name]; return v, ok })
		defer clients.Close() //nolint:errcheck // the clients of the bench's fakes
		switch {
		case c.PubSubSubscription != "":
			cfg.PubSub = &consumer.PubSub{Subscription: c.PubSubSubscription}
			if cfg.PubSubClient, err = clients.PubSub(ctx, ""); err != nil {
				return err
			}
		case c.SQSQueue != "":
			cfg.SQS = &consumer.SQS{Queue: c.SQSQueue}
			if cfg.SQSClient, err = clients.SQS(ctx); err != nil {
				return err
			}
		default:
			cfg.Topics, cfg.Group = []string{c.Topic}, c.Group
			// Short group timings: the run starts with a join.
			cfg.HeartbeatInterval = 250 * time.Millisecond
		}
		if c.IDAttribute != "" {
			cfg.MessageID = &pipeline.Field{Attribute: c.IDAttribute}
		}
		door = cfg.Door()
		con, err := consumer.New(pool, cfg)
		if err != nil {
			return err
		}
		runFn = con.Run
	case "receiver":
		rcv, err := receiver.New(pool, &receiver.Config{
			Schema:   c.Schema,
			MaxBatch: c.Batch,
			Linger:   c.Linger,
			Logger:   log,
			Handoff:  handoff,
			Filter:   filter,
			Sources: []receiver.Source{{
				Name:    cmp.Or(c.Source, defaultSource),
				Verify:  receiver.Verify{Scheme: receiver.SchemeStripe, Secrets: []string{c.Secret}},
				Effect:  receiver.Effect{SQL: fmt.Sprintf(effectSQL, q)},
				Publish: pipeline.Targets{{Topic: c.OutboxTopic, Key: &pipeline.Field{JSON: "/data/object/id"}}},
			}},
		})
		if err != nil {
			return err
		}
		runFn, detail, err = serveHTTP(receiver.NewServer("", rcv, nil), rcv.Close, receiver.ProblemTypeBase)
		if err != nil {
			return err
		}
	case "relay":
		runFn = rel.Run
	case "naive":
		h, err := newNaiveReceiver(ctx, pool, c.Schema, cmp.Or(c.Source, defaultSource), c.Secret, c.OutboxTopic)
		if err != nil {
			return err
		}
		runFn, detail, err = serveHTTP(h, nil, "")
		if err != nil {
			return err
		}
	case "bare":
		runFn, after = serveBare(c, pool)
	default:
		return fmt.Errorf("unknown -serve kind %q (consumer, bare, receiver, relay, naive)", kind)
	}
	runFn = withParts(runFn, parts)

	stopProfile, err := startProfiles(c)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, "ready", detail)
	err = runFn(ctx)
	if perr := stopProfile(); perr != nil && err == nil {
		err = perr
	}
	if after != nil {
		after()
	}
	switch kind {
	case "receiver":
		fmt.Fprintf(os.Stderr, "%s child: %s\n", kind, txSummary("http"))
	case "consumer":
		fmt.Fprintf(os.Stderr, "%s child: %s\n", kind, txSummary(door))
	}
	return err
}

// serveHTTP serves srv on a loopback port until ctx ends, then shuts it down and calls
// closeFn (when set). With a problemTypeBase, the listener is wrapped as the daemon wraps
// the receiver's (internal/problemconn).
func serveHTTP(h any, closeFn func(), problemTypeBase string) (func(context.Context) error, string, error) {
	srv, ok := h.(*http.Server)
	if !ok {
		srv = &http.Server{Handler: h.(http.Handler), ReadHeaderTimeout: 5 * time.Second}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	if problemTypeBase != "" {
		ln = problemconn.Listener(ln, problemTypeBase)
	}
	return func(ctx context.Context) error {
		errc := make(chan error, 1)
		go func() { errc <- srv.Serve(ln) }()
		select {
		case err := <-errc:
			return err
		case <-ctx.Done():
		}
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		err := srv.Shutdown(sctx)
		if closeFn != nil {
			closeFn()
		}
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		return err
	}, ln.Addr().String(), nil
}

// withParts runs main and parts together until ctx ends; the first error of main or of a
// part is returned.
func withParts(main func(context.Context) error, parts []func(context.Context) error) func(context.Context) error {
	if len(parts) == 0 {
		return main
	}
	return func(ctx context.Context) error {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		errc := make(chan error, len(parts)+1)
		for _, p := range append([]func(context.Context) error{main}, parts...) {
			go func() {
				err := p(ctx)
				cancel()
				errc <- err
			}()
		}
		var first error
		for range len(parts) + 1 {
			if err := <-errc; err != nil && first == nil && !errors.Is(err, context.Canceled) {
				first = err
			}
		}
		return first
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// startProfiles starts a CPU profile and block/mutex sampling when a profile directory is
// set; the returned function writes every profile.
func startProfiles(c childConfig) (func() error, error) {
	if c.ProfileDir == "" {
		return func() error { return nil }, nil
	}
	if err := os.MkdirAll(c.ProfileDir, 0o755); err != nil {
		return nil, err
	}
	name := func(kind string) string { return filepath.Join(c.ProfileDir, c.ProfileName+"."+kind+".pprof") }
	f, err := os.Create(name("cpu"))
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		return nil, err
	}
	runtime.SetBlockProfileRate(int((100 * time.Microsecond).Nanoseconds()))
	runtime.SetMutexProfileFraction(100)
	return func() error {
		pprof.StopCPUProfile()
		errs := []error{f.Close()}
		for _, p := range []string{"allocs", "block", "mutex"} {
			out, err := os.Create(name(p))
			if err != nil {
				errs = append(errs, err)
				continue
			}
			errs = append(errs, pprof.Lookup(p).WriteTo(out, 0), out.Close())
		}
		return errors.Join(errs...)
	}, nil
}

// profileSelf starts a CPU profile of the bench process itself (the load generator, its
// polls and the in-process broker) into the profile directory as name, when one is set;
// the returned function stops it, once however often it is called. It does nothing while
// another profile of the process runs.
func (e *env) profileSelf(name string) func() {
	if e.o.profileDir == "" {
		return func() {}
	}
	f, err := os.Create(filepath.Join(e.o.profileDir, name+".cpu.pprof"))
	if err == nil {
		if err = pprof.StartCPUProfile(f); err != nil {
			f.Close()
		}
	}
	if err != nil {
		e.logf("no profile of the bench process: %v", err)
		return func() {}
	}
	return sync.OnceFunc(func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			e.logf("profile of the bench process: %v", err)
		}
	})
}

// pruneLoop is the daemon's pruner role as far as the bench's tables go: every interval,
// the expired dedup records and the outbox rows published more than outboxRetention ago,
// through the stores' Prune methods (their default batch size, as the daemon's); with
// partitionInterval, the dedup records by epochs (processed.Store.PruneEpochs).
func pruneLoop(pool *pgxpool.Pool, schema string, interval, partitionInterval, outboxRetention time.Duration, log *logrus.Entry) (func(context.Context) error, error) {
	ps, err := processed.New(&processed.Config{Schema: schema})
	if err != nil {
		return nil, err
	}
	ob := outbox.New(&outbox.Config{Schema: schema})
	return func(ctx context.Context) error {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			var err error
			if partitionInterval > 0 {
				_, err = ps.PruneEpochs(ctx, pool, partitionInterval, 0)
			} else {
				_, err = ps.Prune(ctx, pool, 0)
			}
			if err != nil && ctx.Err() == nil {
				log.WithError(err).Warn("error pruning dedup records")
			}
			if _, err := ob.PrunePublished(ctx, pool, outboxRetention, 0); err != nil && ctx.Err() == nil {
				log.WithError(err).Warn("error pruning the outbox")
			}
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
		}
	}, nil
}

// txSummary describes the exactly-once transactions of door so far (the child's metrics):
// how many, how many messages each carried and how long each took, on average.
func txSummary(door string) string {
	var size, dur dto.Metric
	if metrics.TxBatchSize.WithLabelValues(door).(prometheus.Histogram).Write(&size) != nil ||
		metrics.TxDuration.WithLabelValues(door).(prometheus.Histogram).Write(&dur) != nil {
		return ""
	}
	n := size.GetHistogram().GetSampleCount()
	if n == 0 {
		return door + ": no transaction"
	}
	return fmt.Sprintf("%s: %d transactions, %.1f messages and %.1f ms each on average", door, n,
		size.GetHistogram().GetSampleSum()/float64(n), 1000*dur.GetHistogram().GetSampleSum()/float64(n))
}

// handoffOverflows is h.Overflows(), 0 without a Handoff (-no-handoff).
func handoffOverflows(h *outbox.Handoff) int64 {
	if h == nil {
		return 0
	}
	return h.Overflows()
}

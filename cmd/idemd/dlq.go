package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sirupsen/logrus"

	"github.com/idemd/idemd/consumer"
	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/delivery"
	"github.com/idemd/idemd/internal/config"
	"github.com/idemd/idemd/internal/daemon"
	"github.com/idemd/idemd/internal/printable"
	"github.com/idemd/idemd/outbox"
	"github.com/idemd/idemd/receiver"
)

func (c *cli) dlq(args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "-help" || args[0] == "help" {
		fmt.Fprintln(c.stdout, "Usage: idemd dlq list [flags]\n       idemd dlq replay [flags] ID...\n\nList dead letters, or run them again through their pipeline once the cause is fixed.\nRun 'idemd dlq list --help' or 'idemd dlq replay --help' for flags.")
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	switch args[0] {
	case "list":
		return c.dlqList(args[1:])
	case "replay":
		return c.dlqReplay(args[1:])
	}
	return c.fail("dlq", exitUsage, fmt.Errorf("unknown subcommand %q: want list or replay", args[0]))
}

func (c *cli) dlqList(args []string) int {
	fs := c.flags("dlq list", "", "List dead letters in id order (not yet replayed ones unless -all).", true)
	pipeline := fs.String("pipeline", "", "only this pipeline's letters")
	after := fs.Int64("after", 0, "only letters with a larger id (paging)")
	limit := fs.Int("limit", 100, "at most this many letters")
	all := fs.Bool("all", false, "include letters already replayed")
	asJSON := fs.Bool("json", false, "one JSON object per line, payload and headers included")
	if code, ok := c.parse(fs, args); !ok {
		return code
	}
	e, err := loadEnv(c.env)
	if err != nil {
		return c.fail("dlq list", exitUsage, err)
	}
	if e.DatabaseURL == "" {
		return c.fail("dlq list", exitUsage, errors.New("IDEMD_DATABASE_URL is required"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := connect(ctx, e)
	if err != nil {
		return c.fail("dlq list", exitFailure, err)
	}
	defer pool.Close()
	letters, err := deadletter.New(e.DBSchema).List(ctx, pool, deadletter.Filter{
		Pipeline: *pipeline, AfterID: *after, Limit: *limit, IncludeReplayed: *all,
	})
	if err != nil {
		return c.fail("dlq list", exitFailure, err)
	}
	if *asJSON {
		// Sender-controlled text: encoding/json leaves C1 controls and bidi overrides raw.
		enc := json.NewEncoder(printable.JSONWriter(c.stdout))
		for _, l := range letters {
			_ = enc.Encode(map[string]any{
				"id": l.ID, "pipeline": l.Pipeline, "scope": l.Scope, "message_id": l.MessageID,
				"reason": l.Reason, "attempts": l.Attempts, "created_at": l.CreatedAt, "replayed_at": l.ReplayedAt,
				"metadata": l.Metadata, "headers": l.Headers, "payload": string(l.Payload),
			})
		}
		return exitOK
	}
	tw := tabwriter.NewWriter(c.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPIPELINE\tMESSAGE_ID\tATTEMPTS\tCREATED_AT\tREPLAYED\tREASON")
	for _, l := range letters {
		replayed := "-"
		if l.ReplayedAt != nil {
			replayed = l.ReplayedAt.Format(time.RFC3339)
		}
		// Ids and reasons come from senders: escaped, so that no byte reaches the terminal raw.
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t%s\n", l.ID, printable.Escape(l.Pipeline), printable.Escape(l.MessageID), l.Attempts,
			l.CreatedAt.Format(time.RFC3339), replayed, printable.Escape(truncate(l.Reason, 80)))
	}
	_ = tw.Flush()
	return exitOK
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}

func (c *cli) dlqReplay(args []string) int {
	fs := c.flags("dlq replay", "ID...", "Run dead letters again, exactly once each, through the door that wrote them: a webhook\n"+
		"through its source and a Kafka record through its subscription (the effect, the publish\n"+
		"event with the original operation id, and the letter's replayed mark commit together; no\n"+
		"broker is contacted), an HTTP delivery by requeueing it to its endpoint (same operation\n"+
		"id). Fix the cause (the effect SQL, the data, the endpoint) first.", true)
	pipelines := fs.String("pipelines", "", "pipelines file (overrides IDEMD_PIPELINES_FILE)")
	if code, ok := c.parse(fs, args); !ok {
		return code
	}
	if fs.NArg() == 0 {
		return c.fail("dlq replay", exitUsage, errors.New("name at least one dead letter id (see idemd dlq list)"))
	}
	var ids []int64
	for _, a := range fs.Args() {
		id, err := strconv.ParseInt(a, 10, 64)
		if err != nil || id <= 0 {
			return c.fail("dlq replay", exitUsage, fmt.Errorf("%q is not a dead letter id", a))
		}
		ids = append(ids, id)
	}
	e, err := loadEnv(c.env)
	if err != nil {
		return c.fail("dlq replay", exitUsage, err)
	}
	if *pipelines != "" {
		e.PipelinesFile = *pipelines
	}
	if e.DatabaseURL == "" {
		return c.fail("dlq replay", exitUsage, errors.New("IDEMD_DATABASE_URL is required"))
	}
	f, err := config.Load(e.PipelinesFile, c.env.lookup)
	if err != nil {
		return c.fail("dlq replay", exitUsage, fmt.Errorf("the pipelines file is not valid:\n%w", err))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	pool, err := connect(ctx, e)
	if err != nil {
		return c.fail("dlq replay", exitFailure, err)
	}
	defer pool.Close()
	r, err := newReplayer(pool, e, f, newLogger(e, c.stderr))
	if err != nil {
		return c.fail("dlq replay", exitUsage, err)
	}
	defer r.close()
	failed := 0
	for _, id := range ids {
		what, err := r.replay(ctx, id)
		switch {
		case err == nil:
			fmt.Fprintf(c.stdout, "%d: %s\n", id, printable.Escape(what))
		case errors.Is(err, receiver.ErrAlreadyReplayed), errors.Is(err, consumer.ErrAlreadyReplayed):
			failed++
			fmt.Fprintf(c.stdout, "%d: not replayed: it was replayed before; not run again\n", id)
		default:
			failed++
			fmt.Fprintf(c.stdout, "%d: not replayed: %s\n", id, printable.Escape(err.Error()))
		}
	}
	if failed > 0 {
		return exitFailure
	}
	return exitOK
}

// replayer sends each dead letter back through the door that wrote it. The doors are built
// on first use, so that a letter of one kind needs nothing of the others (a pipelines file
// without sources, a subscription whose SQL no longer prepares).
type replayer struct {
	pool      *pgxpool.Pool
	letters   *deadletter.Store
	delivery  *delivery.Store
	log       *logrus.Entry
	file      *config.File
	schema    string
	brokers   []string
	sources   map[string]bool
	subs      map[string]*consumer.Config
	rcv       *receiver.Receiver
	consumers map[string]*consumer.Consumer
}

func newReplayer(pool *pgxpool.Pool, e *Env, f *config.File, log *logrus.Entry) (*replayer, error) {
	cfgs, err := daemon.ConsumerConfigs(f)
	if err != nil {
		return nil, err
	}
	r := &replayer{
		pool: pool, letters: deadletter.New(e.DBSchema), delivery: delivery.NewStore(e.DBSchema), log: log,
		file: f, schema: e.DBSchema, brokers: e.KafkaBrokers,
		sources: map[string]bool{}, subs: map[string]*consumer.Config{}, consumers: map[string]*consumer.Consumer{},
	}
	for _, s := range f.Sources {
		r.sources[s.Name] = true
	}
	for _, cfg := range cfgs {
		r.subs[cfg.Name] = cfg
	}
	return r, nil
}

func (r *replayer) close() {
	if r.rcv != nil {
		r.rcv.Close()
	}
}

// replay replays letter id and says what it did.
func (r *replayer) replay(ctx context.Context, id int64) (string, error) {
	l, err := r.peek(ctx, id)
	if err != nil {
		return "", err
	}
	switch {
	case strings.HasPrefix(l.Scope, "http:") || l.Metadata["door"] == "http_delivery":
		return r.requeue(ctx, id)
	case strings.HasPrefix(l.Scope, "kafka:") || l.Metadata["door"] == "relay":
		return r.republish(ctx, id)
	case r.subs[l.Pipeline] != nil:
		c, err := r.consumer(l.Pipeline)
		if err != nil {
			return "", err
		}
		if err := c.Replay(ctx, id); err != nil {
			return "", err
		}
		return fmt.Sprintf("replayed through subscription %q", l.Pipeline), nil
	case r.sources[l.Pipeline]:
		if r.rcv == nil {
			rcfg, err := daemon.ReceiverConfig(r.file)
			if err != nil {
				return "", err
			}
			rcfg.Schema, rcfg.Logger = r.schema, r.log
			if r.rcv, err = receiver.New(r.pool, rcfg); err != nil {
				return "", err
			}
		}
		if err := r.rcv.Replay(ctx, id); err != nil {
			return "", err
		}
		return fmt.Sprintf("replayed through source %q", l.Pipeline), nil
	}
	return "", fmt.Errorf("its pipeline %q is not in the pipelines file", l.Pipeline)
}

// peek reads a letter to route it; the door locks and checks it again.
func (r *replayer) peek(ctx context.Context, id int64) (*deadletter.Letter, error) {
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("error reading dead letter %d: %w", id, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	return r.letters.GetTx(ctx, tx, id)
}

// consumer builds a subscription's consumer for Replay, which never contacts Kafka: New
// wants brokers in its config, and gets a placeholder when none are configured.
func (r *replayer) consumer(name string) (*consumer.Consumer, error) {
	if c := r.consumers[name]; c != nil {
		return c, nil
	}
	cfg := *r.subs[name]
	cfg.Schema, cfg.Logger, cfg.Brokers = r.schema, r.log, r.brokers
	if len(cfg.Brokers) == 0 {
		cfg.Brokers = []string{"replay-contacts-no-broker:9092"}
	}
	c, err := consumer.New(r.pool, &cfg)
	if err != nil {
		return nil, err
	}
	r.consumers[name] = c
	return c, nil
}

// requeue replays an HTTP delivery's letter: the delivery is made pending again and the
// letter marked replayed in one transaction, under the letter's lock, so that two replays
// cannot requeue it twice.
func (r *replayer) requeue(ctx context.Context, id int64) (string, error) {
	var what string
	err := r.letters.Replay(ctx, r.pool, id, func(ctx context.Context, tx pgx.Tx, l *deadletter.Letter) error {
		did, ok := metaID(l.Metadata["delivery_id"])
		if !ok {
			return fmt.Errorf("dead letter %d names no delivery_id", id)
		}
		if err := r.delivery.RequeueTx(ctx, tx, did); err != nil {
			if errors.Is(err, delivery.ErrNotFound) {
				return fmt.Errorf("delivery %d no longer exists (pruned?); the payload is in `idemd dlq list -json`", did)
			}
			return err
		}
		what = fmt.Sprintf("delivery %d requeued to endpoint %q with the same operation id", did, strings.TrimPrefix(l.Scope, "http:"))
		return nil
	})
	return what, err
}

// republish replays an outbox event the broker refused as too large (once the topic's
// max.message.bytes allows it): the event goes back to the outbox with its operation id, and
// the letter is marked replayed, in one transaction under the letter's lock.
func (r *replayer) republish(ctx context.Context, id int64) (string, error) {
	var what string
	err := r.letters.Replay(ctx, r.pool, id, func(ctx context.Context, tx pgx.Tx, l *deadletter.Letter) error {
		topic, _ := l.Metadata["topic"].(string)
		opText, _ := l.Metadata["operation_id"].(string)
		op, err := uuid.Parse(opText)
		if topic == "" || err != nil {
			return fmt.Errorf("dead letter %d names no topic or operation id", id)
		}
		ev := outbox.Event{Topic: topic, Payload: l.Payload, Pipeline: l.Pipeline, CausationID: l.MessageID, OperationID: op,
			Headers: map[string]string{}}
		if k, _ := l.Metadata["key"].(string); k != "" {
			ev.Key = []byte(k)
		}
		for k, v := range l.Headers {
			switch k {
			case outbox.HeaderOperationID, outbox.HeaderCausationID, outbox.HeaderPipeline:
			default: // the relay sets those three again
				if len(v) > 0 {
					ev.Headers[k] = v[0]
				}
			}
		}
		if err := outbox.New(&outbox.Config{Schema: r.schema}).EnqueueTx(ctx, tx, ev); err != nil {
			return err
		}
		what = fmt.Sprintf("event requeued to topic %q with the same operation id %s", topic, op)
		return nil
	})
	return what, err
}

// metaID reads an id from a letter's metadata (JSON: a float64 once decoded).
func metaID(v any) (int64, bool) {
	switch x := v.(type) {
	case float64:
		return int64(x), x > 0 && x == float64(int64(x))
	case string:
		n, err := strconv.ParseInt(x, 10, 64)
		return n, err == nil && n > 0
	case json.Number:
		n, err := x.Int64()
		return n, err == nil && n > 0
	}
	return 0, false
}

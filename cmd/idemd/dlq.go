package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/signal"
	"strconv"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sirupsen/logrus"

	"github.com/idemd/idemd/config"
	"github.com/idemd/idemd/consumer"
	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/delivery"
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
		enc := json.NewEncoder(c.stdout)
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
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t%s\n", l.ID, l.Pipeline, l.MessageID, l.Attempts,
			l.CreatedAt.Format(time.RFC3339), replayed, truncate(l.Reason, 80))
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
	r, closeDoors := newReplayer(pool, e, f, newLogger(e, c.stderr))
	defer closeDoors()
	failed := 0
	for _, id := range ids {
		what, err := r.Replay(ctx, id)
		switch {
		case err == nil:
			fmt.Fprintf(c.stdout, "%d: %s\n", id, what)
		case errors.Is(err, deadletter.ErrAlreadyReplayed):
			failed++
			fmt.Fprintf(c.stdout, "%d: not replayed: it was replayed before; not run again\n", id)
		default:
			failed++
			fmt.Fprintf(c.stdout, "%d: not replayed: %v\n", id, err)
		}
	}
	if failed > 0 {
		return exitFailure
	}
	return exitOK
}

// newReplayer registers every door of the pipelines file with a deadletter.Replayer, so
// that each letter goes back through the door that wrote it. A door that cannot be built (a
// subscription whose SQL no longer prepares) refuses only its own letters, with its error.
func newReplayer(pool *pgxpool.Pool, e *Env, f *config.File, log *logrus.Entry) (*deadletter.Replayer, func()) {
	rp := deadletter.NewReplayer(pool, deadletter.New(e.DBSchema))
	outbox.New(&outbox.Config{Schema: e.DBSchema}).RegisterReplay(rp)
	delivery.NewStore(e.DBSchema).RegisterReplay(rp)
	refuse := func(door deadletter.Door, pipeline string, err error) {
		rp.Register(door, pipeline, func(context.Context, pgx.Tx, *deadletter.Letter) (string, error) { return "", err })
	}
	closeDoors := func() {}
	if len(f.Sources) > 0 {
		rcfg := f.Receiver()
		rcfg.Schema, rcfg.Logger = e.DBSchema, log
		rcv, err := receiver.New(pool, rcfg)
		if err != nil {
			refuse(deadletter.DoorHTTP, "", fmt.Errorf("the receiver cannot be built: %w", err))
		} else {
			rcv.RegisterReplay(rp)
			closeDoors = rcv.Close
		}
	}
	for _, cfg := range f.Consumers() {
		cfg.Schema, cfg.Logger, cfg.Brokers = e.DBSchema, log, e.KafkaBrokers
		if c, err := consumer.New(pool, cfg); err != nil {
			refuse(deadletter.DoorKafka, cfg.Name, err)
		} else {
			c.RegisterReplay(rp)
		}
	}
	return rp, closeDoors
}

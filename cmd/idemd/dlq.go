package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sirupsen/logrus"

	"github.com/idemd/idemd/admin"
	"github.com/idemd/idemd/config"
	"github.com/idemd/idemd/consumer"
	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/delivery"
	"github.com/idemd/idemd/internal/printable"
	"github.com/idemd/idemd/outbox"
	"github.com/idemd/idemd/processed"
	"github.com/idemd/idemd/receiver"
)

func (c *cli) dlq(args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "-help" || args[0] == "help" {
		fmt.Fprintln(c.stdout, "Usage: idemd dlq list [flags]\n       idemd dlq show ID\n       idemd dlq replay [flags] [ID...]\n\n"+
			"List dead letters, show one whole, or run them again through their pipeline once the cause is\n"+
			"fixed: by id, or every letter a filter selects (-dry-run counts first).\n"+
			"Run 'idemd dlq <subcommand> --help' for flags.")
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	switch args[0] {
	case "list":
		return c.dlqList(args[1:])
	case "show":
		return c.dlqShow(args[1:])
	case "replay":
		return c.dlqReplay(args[1:])
	}
	return c.fail("dlq", exitUsage, fmt.Errorf("unknown subcommand %q: want list, show or replay", args[0]))
}

// letterFlags are the filter flags of dlq list and dlq replay.
type letterFlags struct {
	pipeline, origin, reason, since, until *string
}

func addLetterFlags(fs interface {
	String(name, value, usage string) *string
}) letterFlags {
	return letterFlags{
		pipeline: fs.String("pipeline", "", "only this pipeline's letters"),
		origin:   fs.String("origin", "", "only letters of this origin (the door that wrote them): "+doorList()),
		reason:   fs.String("reason", "", "only letters whose reason contains this text (case-insensitive)"),
		since:    fs.String("since", "", "only letters written at or after this time (RFC 3339, e.g. 2026-01-02T14:00:00Z)"),
		until:    fs.String("until", "", "only letters written before this time (RFC 3339)"),
	}
}

// filter checks the flags and returns the letters' filter.
func (f letterFlags) filter() (admin.LetterFilter, error) {
	lf := admin.LetterFilter{Pipeline: *f.pipeline, Origin: *f.origin, Reason: *f.reason}
	if lf.Origin != "" && !slices.Contains(deadletter.Doors, deadletter.Door(lf.Origin)) {
		return lf, fmt.Errorf("-origin %q: want one of %s", lf.Origin, doorList())
	}
	for _, t := range []struct {
		flag, value string
		into        **time.Time
	}{{"-since", *f.since, &lf.Since}, {"-until", *f.until, &lf.Until}} {
		if t.value == "" {
			continue
		}
		v, err := time.Parse(time.RFC3339Nano, t.value)
		if err != nil {
			return lf, fmt.Errorf("%s %q is not an RFC 3339 time (like 2026-01-02T14:00:00Z)", t.flag, t.value)
		}
		*t.into = &v
	}
	return lf, nil
}

func (f letterFlags) empty() bool {
	return *f.pipeline == "" && *f.origin == "" && *f.reason == "" && *f.since == "" && *f.until == ""
}

// doorList names the doors, for help texts and errors.
func doorList() string {
	names := make([]string, len(deadletter.Doors))
	for i, d := range deadletter.Doors {
		names[i] = string(d)
	}
	return strings.Join(names, ", ")
}

// dbCommand loads the environment and connects, for the commands that read the database.
func (c *cli) dbCommand(name string, ctx context.Context) (*Env, *pgxpool.Pool, int) {
	e, err := loadEnvFor(name, c.env)
	if err != nil {
		return nil, nil, c.fail(name, exitUsage, err)
	}
	if e.DatabaseURL == "" {
		return nil, nil, c.fail(name, exitUsage, errNoDatabaseURL)
	}
	pool, err := connect(ctx, e)
	if err != nil {
		return nil, nil, c.fail(name, exitFailure, err)
	}
	return e, pool, exitOK
}

func (c *cli) dlqList(args []string) int {
	fs := c.flags("dlq list", "", "List dead letters, oldest first (not yet replayed ones unless -all).", true)
	lf := addLetterFlags(fs)
	after := fs.Int64("after", 0, "only letters with a larger id (the next page)")
	limit := fs.Int("limit", 100, "at most this many letters")
	all := fs.Bool("all", false, "include letters already replayed")
	asJSON := fs.Bool("json", false, "one JSON object per line, payload and headers included (secrets stripped, as in the admin API)")
	if code, ok := c.parse(fs, args); !ok {
		return code
	}
	f, err := lf.filter()
	if err != nil {
		return c.fail("dlq list", exitUsage, err)
	}
	if *limit < 1 {
		return c.fail("dlq list", exitUsage, errors.New("-limit must be positive"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e, pool, code := c.dbCommand("dlq list", ctx)
	if pool == nil {
		return code
	}
	defer pool.Close()
	q := admin.LetterQuery(f)
	q.AfterID, q.Limit, q.Ascending = *after, *limit+1, true
	if !*all {
		no := false
		q.Replayed = &no
	}
	letters, err := deadletter.New(e.DBSchema).Find(ctx, pool, q)
	if err != nil {
		return c.fail("dlq list", exitFailure, err)
	}
	cut := len(letters) > *limit
	if cut {
		letters = letters[:*limit]
	}
	if *asJSON {
		// Sender-controlled text: encoding/json leaves C1 controls and bidi overrides raw.
		enc := json.NewEncoder(printable.JSONWriter(c.stdout))
		for i := range letters {
			_ = enc.Encode(admin.ListLetter(letters[i]))
		}
	} else {
		tw := tabwriter.NewWriter(c.stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tPIPELINE\tORIGIN\tMESSAGE_ID\tATTEMPTS\tCREATED_AT\tREPLAYED\tREASON")
		for i := range letters {
			l := admin.ListLetter(letters[i]) // the reason's URLs redacted
			replayed := "-"
			if l.ReplayedAt != nil {
				replayed = l.ReplayedAt.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", l.ID, printable.Escape(l.Pipeline), l.Origin, printable.Escape(l.MessageID), l.Attempts,
				l.CreatedAt.UTC().Format(time.RFC3339), replayed, truncate(printable.Escape(l.Reason), 80))
		}
		_ = tw.Flush()
	}
	if cut {
		fmt.Fprintf(c.stderr, "note: the list is cut at -limit %d; more letters match: add -after %d for the next page\n", *limit, letters[len(letters)-1].ID)
	}
	return exitOK
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	k := n - 1
	for k > 0 && !utf8.RuneStart(s[k]) {
		k--
	}
	return s[:k] + "…"
}

func (c *cli) dlqShow(args []string) int {
	fs := c.flags("dlq show", "ID", "Show one dead letter whole: where it came from, why it failed, its payload and headers\n(secrets stripped) and its replays.", true)
	asJSON := fs.Bool("json", false, "print JSON")
	if code, ok := c.parse(fs, args); !ok {
		return code
	}
	if fs.NArg() != 1 {
		return c.fail("dlq show", exitUsage, errors.New("name one dead letter id (see idemd dlq list)"))
	}
	id, err := strconv.ParseInt(fs.Arg(0), 10, 64)
	if err != nil || id <= 0 {
		return c.fail("dlq show", exitUsage, fmt.Errorf("%q is not a dead letter id", fs.Arg(0)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e, pool, code := c.dbCommand("dlq show", ctx)
	if pool == nil {
		return code
	}
	defer pool.Close()
	adm, err := admin.New(pool, &admin.Config{Schema: e.DBSchema, Logger: newLogger(e, c.stderr)})
	if err != nil {
		return c.fail("dlq show", exitFailure, err)
	}
	l, err := adm.DeadLetter(ctx, id)
	if errors.Is(err, deadletter.ErrNotFound) {
		return c.fail("dlq show", exitFailure, fmt.Errorf("no dead letter %d (never written, or pruned)", id))
	}
	if err != nil {
		return c.fail("dlq show", exitFailure, err)
	}
	if *asJSON {
		return c.printJSON(l)
	}
	w := c.stdout
	replayed := "not yet"
	if l.ReplayedAt != nil {
		replayed = l.ReplayedAt.UTC().Format(time.RFC3339)
	}
	fmt.Fprintf(w, "dead letter %d\n  pipeline:   %s\n  origin:     %s\n  message id: %s\n  reason:     %s\n  attempts:   %d\n  created:    %s\n  replayed:   %s\n",
		l.ID, printable.Escape(l.Pipeline), l.Origin, printable.Escape(l.MessageID), printable.Escape(l.Reason), l.Attempts, l.CreatedAt.UTC().Format(time.RFC3339), replayed)
	printMap(w, "metadata", l.Metadata)
	headers := map[string]any{}
	for k, v := range l.Headers {
		headers[k] = strings.Join(v, ", ")
	}
	printMap(w, "headers (secrets stripped)", headers)
	fmt.Fprintf(w, "payload (%s):\n  %s\n", l.Payload.Encoding, strings.ReplaceAll(printable.Escape(l.Payload.Data), "\n", "\n  "))
	if len(l.Replays) > 0 {
		fmt.Fprintln(w, "replays:")
		for _, r := range l.Replays {
			fmt.Fprintf(w, "  %s  %s  %s  %s\n", r.At.UTC().Format(time.RFC3339), printable.Escape(r.Actor), r.Outcome, printable.Escape(r.Detail))
		}
	}
	return exitOK
}

func printMap(w io.Writer, title string, m map[string]any) {
	if len(m) == 0 {
		return
	}
	fmt.Fprintf(w, "%s:\n", title)
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "  %s: %s\n", printable.Escape(k), printable.Escape(fmt.Sprint(m[k])))
	}
}

func (c *cli) printJSON(v any) int {
	enc := json.NewEncoder(c.stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return c.fail("json", exitFailure, err)
	}
	return exitOK
}

func (c *cli) dlqReplay(args []string) int {
	fs := c.flags("dlq replay", "[ID...]", "Run dead letters again, exactly once each, through the door that wrote them: a webhook\n"+
		"through its source and a Kafka record through its subscription (the effect, the publish\n"+
		"event with the original operation id, and the letter's replayed mark commit together; no\n"+
		"broker is contacted), an HTTP delivery by requeueing it to its endpoint (same operation\n"+
		"id). Fix the cause (the effect SQL, the data, the endpoint) first.\n\n"+
		"Name letters by id, or select them with the filter flags (every letter not yet replayed\n"+
		"that matches, oldest first); -all selects every letter not yet replayed. -dry-run counts\n"+
		"what would be replayed. Each replay is audited (admin_audit) as cli:$USER (cli:uid:<uid>\n"+
		"when USER is unset).\n\n"+
		"Without IDEMD_PIPELINES_FILE or -pipelines, when idemd.yaml does not exist and the database\n"+
		"has dev's example schema (IDEMD_DB_SCHEMA with _dev appended), the letters of an idemd dev run\n"+
		"are replayed through dev's pipelines, as sign does, with that schema first on the search_path\n"+
		"unless IDEMD_DB_SEARCH_PATH is set.", true)
	pipelines := fs.String("pipelines", "", "pipelines file (overrides IDEMD_PIPELINES_FILE)")
	lf := addLetterFlags(fs)
	all := fs.Bool("all", false, "with no id and no filter: every letter not yet replayed")
	dryRun := fs.Bool("dry-run", false, "count the letters that would be replayed; replay nothing")
	if code, ok := c.parse(fs, args); !ok {
		return code
	}
	var ids []int64
	for _, a := range fs.Args() {
		id, err := strconv.ParseInt(a, 10, 64)
		if err != nil || id <= 0 {
			return c.fail("dlq replay", exitUsage, fmt.Errorf("%q is not a dead letter id", a))
		}
		ids = append(ids, id)
	}
	filter, err := lf.filter()
	if err != nil {
		return c.fail("dlq replay", exitUsage, err)
	}
	switch {
	case len(ids) > 0 && (!lf.empty() || *all):
		return c.fail("dlq replay", exitUsage, errors.New("name ids, or give filter flags (or -all), not both"))
	case len(ids) == 0 && lf.empty() && !*all:
		return c.fail("dlq replay", exitUsage, errors.New("name dead letter ids, or select letters with -pipeline, -origin, -reason, -since, -until, or -all (see idemd dlq list)"))
	case len(ids) > 0 && *dryRun:
		return c.fail("dlq replay", exitUsage, errors.New("-dry-run counts the letters a filter selects; with ids there is nothing to count"))
	}
	e, err := loadEnvFor("dlq replay", c.env)
	if err != nil {
		return c.fail("dlq replay", exitUsage, err)
	}
	if *pipelines != "" {
		e.PipelinesFile, e.set["IDEMD_PIPELINES_FILE"] = *pipelines, true
	}
	if e.DatabaseURL == "" {
		return c.fail("dlq replay", exitUsage, errNoDatabaseURL)
	}
	// A dev run's letters: no pipelines file named and none where the default points, so
	// dev's embedded pipelines are the candidate, confirmed below by dev's schema in the
	// database. A production schema never falls back to them.
	var f *config.File
	devSchema := ""
	if !*dryRun {
		_, statErr := os.Stat(e.PipelinesFile)
		if !e.set["IDEMD_PIPELINES_FILE"] && errors.Is(statErr, os.ErrNotExist) {
			devSchema = e.DBSchema + "_dev"
			if e.DBSearchPath == "" {
				e.DBSearchPath = devSearchPath(devSchema)
			}
			f, _, err = devPipelines(e, c.env)
		} else {
			f, err = loadPipelines(e.PipelinesFile, c.env.lookup)
		}
		if err != nil {
			return c.fail("dlq replay", exitUsage, err)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	pool, err := connect(ctx, e)
	if err != nil {
		return c.fail("dlq replay", exitFailure, err)
	}
	defer pool.Close()
	if devSchema != "" {
		dev, err := devSchemaExists(ctx, pool, devSchema)
		switch {
		case err != nil:
			return c.fail("dlq replay", exitFailure, err)
		case !dev:
			return c.fail("dlq replay", exitUsage, pipelinesNotFound(e.PipelinesFile, os.ErrNotExist))
		}
		fmt.Fprintf(c.stderr, "no pipelines file: replaying through dev's pipelines (%s), search_path %s\n", devPipelineSrc, e.DBSearchPath)
	}
	log := newLogger(e, c.stderr)
	cfg := &admin.Config{Schema: e.DBSchema, Logger: log}
	if f != nil {
		rep, closeDoors := newReplayer(pool, e, f, log)
		defer closeDoors()
		cfg.Replayer = rep
	}
	adm, err := admin.New(pool, cfg)
	if err != nil {
		return c.fail("dlq replay", exitFailure, err)
	}
	actor := "cli:" + cmpOr(c.env["USER"], "uid:"+strconv.Itoa(os.Getuid()))
	if len(ids) > 0 {
		failed := 0
		for _, id := range ids {
			what, err := cfg.Replayer.Replay(ctx, id)
			adm.RecordReplay(ctx, actor, id, err)
			switch {
			case err == nil:
				fmt.Fprintf(c.stdout, "%d: %s\n", id, what.Done)
			case errors.Is(err, deadletter.ErrAlreadyReplayed):
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
	progress := newProgress(c.stderr)
	res, err := adm.BulkReplay(ctx, actor, admin.BulkReplayRequest{LetterFilter: filter, DryRun: *dryRun, All: *all}, progress.update)
	if err != nil {
		fmt.Fprintf(c.stdout, "stopped: %d matched, %d replayed, %d skipped, %d failed\n", res.Matched, res.Replayed, res.Skipped, res.Failed)
		return c.fail("dlq replay", exitFailure, err)
	}
	if res.DryRun {
		fmt.Fprintf(c.stdout, "dry run: %d letters match and would be replayed\n", res.Matched)
	} else {
		fmt.Fprintf(c.stdout, "%d matched, %d replayed, %d skipped (replayed by someone else meanwhile), %d failed\n", res.Matched, res.Replayed, res.Skipped, res.Failed)
		for _, e := range res.Errors {
			fmt.Fprintf(c.stdout, "%d: not replayed: %s\n", e.ID, printable.Escape(e.Error))
		}
	}
	if res.More {
		fmt.Fprintf(c.stdout, "note: more than %d letters match; run it again for the rest\n", admin.BulkLimitMax)
	}
	if res.Failed > 0 {
		return exitFailure
	}
	return exitOK
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// progress prints a line about a long bulk replay at most once a second, and at the end.
type progress struct {
	w    io.Writer
	last time.Time
}

func newProgress(w io.Writer) *progress { return &progress{w: w, last: time.Now()} }

func (p *progress) update(r admin.BulkReplayResult) {
	done := r.Replayed + r.Skipped + r.Failed
	if time.Since(p.last) < time.Second && done != r.Matched {
		return
	}
	p.last = time.Now()
	fmt.Fprintf(p.w, "progress: %d/%d letters (%d replayed, %d skipped, %d failed)\n", done, r.Matched, r.Replayed, r.Skipped, r.Failed)
}

// adminReplayer is the daemon's replayer for the admin API: the dlq command's, on the
// daemon's pool.
func adminReplayer(e *Env, f *config.File, log *logrus.Entry) func(pool *pgxpool.Pool) admin.Replayer {
	return func(pool *pgxpool.Pool) admin.Replayer {
		r, _ := newReplayer(pool, e, f, log) // its doors live as long as the process
		return r
	}
}

// newReplayer registers every door of the pipelines file with a deadletter.Replayer, so
// that each letter goes back through the door that wrote it. A door that cannot be built (a
// subscription whose SQL no longer prepares) refuses only its own letters, with its error.
func newReplayer(pool *pgxpool.Pool, e *Env, f *config.File, log *logrus.Entry) (*deadletter.Replayer, func()) {
	rp := deadletter.NewReplayer(pool, deadletter.New(e.DBSchema))
	outbox.New(&outbox.Config{Schema: e.DBSchema}).RegisterReplay(rp)
	delivery.NewStore(e.DBSchema).RegisterReplay(rp)
	// The relay's and the deliverer's letters may be of any pipeline: the series their
	// replays count in start at 0 for each of the file's (the doors' own, in RegisterReplay).
	for _, p := range f.Pipelines() {
		rp.Expect(deadletter.DoorRelay, p, deadletter.ReplayRequeued)
		rp.Expect(deadletter.DoorDelivery, p, deadletter.ReplayRequeued)
	}
	refuse := func(door deadletter.Door, pipeline string, err error) {
		rp.Register(door, pipeline, func(context.Context, pgx.Tx, *deadletter.Letter) (deadletter.Replayed, error) {
			return deadletter.Replayed{}, err
		})
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
			refuse(deadletter.Door(cfg.Door()), cfg.Name, err)
		} else {
			c.RegisterReplay(rp)
		}
	}
	return rp, closeDoors
}

// inspect prints a message's whole story.
func (c *cli) inspect(args []string) int {
	fs := c.flags("inspect", "PIPELINE ID", "Show a message's whole story: its processed record (fingerprint, stored response,\n"+
		"retention), its effect's outcome, its outbox rows and their publication, its HTTP\n"+
		"deliveries, its conflicts and its dead letters.", true)
	tenant := fs.String("tenant", "", "the tenant of an API source's idempotency key (default: the newest record of the id; the other tenants holding it are named)")
	asJSON := fs.Bool("json", false, "print JSON (the admin API's GET /api/v1/messages/{pipeline}/{id})")
	if code, ok := c.parse(fs, args); !ok {
		return code
	}
	if fs.NArg() != 2 {
		return c.fail("inspect", exitUsage, errors.New("name a pipeline and a message id (or idempotency key)"))
	}
	pipeline, id := fs.Arg(0), fs.Arg(1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e, pool, code := c.dbCommand("inspect", ctx)
	if pool == nil {
		return code
	}
	defer pool.Close()
	adm, err := admin.New(pool, &admin.Config{Schema: e.DBSchema, OutboxKeepsPublished: e.OutboxKeepPublished, Logger: newLogger(e, c.stderr)})
	if err != nil {
		return c.fail("inspect", exitFailure, err)
	}
	st, err := adm.Story(ctx, pipeline, id, *tenant)
	if errors.Is(err, processed.ErrNotFound) {
		return c.fail("inspect", exitFailure, fmt.Errorf("no record of message %q in pipeline %q (never received, or pruned after its retention)", printable.Escape(id), printable.Escape(pipeline)))
	}
	if err != nil {
		return c.fail("inspect", exitFailure, err)
	}
	if *asJSON {
		return c.printJSON(st)
	}
	printStory(c.stdout, st)
	return exitOK
}

func printStory(w io.Writer, st *admin.Story) {
	at := func(t *time.Time) string {
		if t == nil {
			return "-"
		}
		return t.UTC().Format(time.RFC3339)
	}
	fmt.Fprintf(w, "message %s of pipeline %s", printable.Escape(st.MessageID), printable.Escape(st.Pipeline))
	if st.Tenant != "" {
		fmt.Fprintf(w, " (tenant %s)", printable.Escape(st.Tenant))
	}
	if st.BodyClaim {
		fmt.Fprint(w, " (the claim of a signed body, not a message)")
	}
	if len(st.OtherTenants) > 0 {
		others := make([]string, len(st.OtherTenants))
		for i, t := range st.OtherTenants {
			others[i] = printable.Escape(t)
		}
		fmt.Fprintf(w, "\n  also held by tenants %s (this is the newest record; see -tenant)", strings.Join(others, ", "))
	}
	fmt.Fprintf(w, "\n  record:      %s, fingerprint %s\n  received:    %s\n  completed:   %s\n  retention:   until %s (then the id counts as new)\n",
		st.Status, st.Fingerprint, st.ReceivedAt.UTC().Format(time.RFC3339), at(st.CompletedAt), st.ExpiresAt.UTC().Format(time.RFC3339))
	effect := st.Effect.Outcome
	if st.Effect.Attempts > 0 {
		effect += fmt.Sprintf(" after %d attempts", st.Effect.Attempts)
	}
	if st.Effect.Reason != "" {
		effect += ": " + printable.Escape(st.Effect.Reason)
	}
	fmt.Fprintf(w, "  effect:      %s\n", effect)
	if r := st.Response; r != nil {
		body := ""
		if r.Body != nil {
			body = truncate(printable.Escape(r.Body.Data), 200)
		}
		fmt.Fprintf(w, "  response:    %d %s\n", r.Status, body)
	}
	if st.OutboxPublishedKept {
		fmt.Fprintf(w, "outbox rows (%d):\n", len(st.Outbox))
	} else {
		fmt.Fprintf(w, "outbox rows still to publish (%d; published rows are deleted, see IDEMD_OUTBOX_KEEP_PUBLISHED):\n", len(st.Outbox))
	}
	for _, o := range st.Outbox {
		pub := "unpublished"
		if o.PublishedAt != nil {
			pub = "published " + at(o.PublishedAt)
		}
		fmt.Fprintf(w, "  %d  topic %s  operation %s  %s\n", o.ID, printable.Escape(o.Topic), o.OperationID, pub)
	}
	fmt.Fprintf(w, "deliveries (%d):\n", len(st.Deliveries))
	for _, d := range st.Deliveries {
		fmt.Fprintf(w, "  %d  endpoint %s  %s after %d attempts  %s\n", d.ID, printable.Escape(d.Endpoint), d.State, d.Attempts, printable.Escape(d.LastError))
	}
	fmt.Fprintf(w, "conflicts (%d):\n", len(st.Conflicts))
	for _, cf := range st.Conflicts {
		fmt.Fprintf(w, "  fingerprint %s seen %d times, last %s\n", cf.IncomingFingerprint, cf.Count, cf.LastSeenAt.UTC().Format(time.RFC3339))
	}
	fmt.Fprintf(w, "dead letters (%d):\n", len(st.DeadLetters))
	for _, l := range st.DeadLetters {
		replayed := "not replayed"
		if l.ReplayedAt != nil {
			replayed = "replayed " + at(l.ReplayedAt)
		}
		fmt.Fprintf(w, "  %d  %s  %s  %s\n", l.ID, l.Origin, replayed, truncate(printable.Escape(l.Reason), 100))
	}
}

package admin

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/idemd/idemd/deadletter"
)

// DeadLetterBrief is a dead letter in a list.
type DeadLetterBrief struct {
	ID       int64  `json:"id"`
	Pipeline string `json:"pipeline"`
	// Origin is the door that wrote the letter: http, kafka, pubsub, sqs, relay or delivery.
	Origin      string         `json:"origin"`
	OutboxID    int64          `json:"outbox_id,omitempty"`
	DeliveryID  int64          `json:"delivery_id,omitempty"`
	OperationID string         `json:"operation_id,omitempty"`
	MessageID   string         `json:"message_id,omitempty"`
	Reason      string         `json:"reason"`
	Attempts    int            `json:"attempts"`
	CreatedAt   time.Time      `json:"created_at"`
	ReplayedAt  *time.Time     `json:"replayed_at,omitempty"`
	Metadata    map[string]any `json:"metadata"`
}

// DeadLetter is one dead letter, whole.
type DeadLetter struct {
	DeadLetterBrief
	Scope   string              `json:"scope"`
	Payload *body               `json:"payload"`
	Headers map[string][]string `json:"headers"`
	// Replays are the audited replay attempts of this letter.
	Replays []Entry `json:"replays"`
}

// ListedLetter is a letter as `idemd dlq list -json` prints it, one per line: the API's
// letter (GET /api/v1/dead-letters/{id}) without its replays, secrets stripped and URLs
// redacted as there.
type ListedLetter struct {
	DeadLetterBrief
	Scope   string              `json:"scope"`
	Payload *body               `json:"payload"`
	Headers map[string][]string `json:"headers"`
}

// ListLetter returns l as `idemd dlq list` shows it.
func ListLetter(l *deadletter.Letter) *ListedLetter {
	return &ListedLetter{DeadLetterBrief: briefOf(l), Scope: l.Scope, Payload: encodeBody(l.Payload), Headers: stripHeaders(l.Headers)}
}

func briefOf(l *deadletter.Letter) DeadLetterBrief {
	b := DeadLetterBrief{
		ID: l.ID, Pipeline: l.Pipeline, Origin: string(l.Origin.Door), OutboxID: l.Origin.OutboxID, DeliveryID: l.Origin.DeliveryID,
		MessageID: l.MessageID, Reason: redactURLs(l.Reason),
		Attempts: l.Attempts, CreatedAt: l.CreatedAt, ReplayedAt: l.ReplayedAt, Metadata: redactMetadata(l.Metadata),
	}
	if l.Origin.OperationID != uuid.Nil {
		b.OperationID = l.Origin.OperationID.String()
	}
	return b
}

// origins are the values of the origin filter: the doors.
func origins() []string {
	out := make([]string, len(deadletter.Doors))
	for i, d := range deadletter.Doors {
		out[i] = string(d)
	}
	return out
}

// LetterFilter is the filter of dead-letter lists and bulk replays.
type LetterFilter struct {
	Pipeline  string     `json:"pipeline,omitempty"`
	Origin    string     `json:"origin,omitempty"`
	Reason    string     `json:"reason,omitempty"`
	MessageID string     `json:"message_id,omitempty"`
	Since     *time.Time `json:"since,omitempty"`
	Until     *time.Time `json:"until,omitempty"`
}

// LetterQuery is the store query of f.
func LetterQuery(f LetterFilter) deadletter.Query { return f.query() }

func (f LetterFilter) query() deadletter.Query {
	q := deadletter.Query{Pipeline: f.Pipeline, Door: deadletter.Door(f.Origin), Reason: f.Reason, MessageID: f.MessageID}
	if f.Since != nil {
		q.Since = *f.Since
	}
	if f.Until != nil {
		q.Until = *f.Until
	}
	return q
}

func letterFilter(p *params) LetterFilter {
	f := LetterFilter{Pipeline: p.str("pipeline"), Origin: p.oneOf("origin", origins()...), Reason: p.str("reason"), MessageID: p.str("id")}
	if t := p.time("since"); !t.IsZero() {
		f.Since = &t
	}
	if t := p.time("until"); !t.IsZero() {
		f.Until = &t
	}
	return f
}

func (s *Server) listLetters(r *http.Request, q deadletter.Query) ([]DeadLetterBrief, string, error) {
	limit := q.Limit
	q.Limit++
	ls, err := s.letters.Find(r.Context(), s.pool, q)
	if err != nil {
		return nil, "", err
	}
	ls, more := page1(ls, limit)
	out := make([]DeadLetterBrief, len(ls))
	for i, l := range ls {
		out[i] = briefOf(l)
	}
	var last int64
	if len(ls) > 0 {
		last = ls[len(ls)-1].ID
	}
	return out, nextID(more, last), nil
}

// lettersQuery reads GET /api/v1/dead-letters's parameters.
func lettersQuery(p *params) deadletter.Query {
	q := letterFilter(p).query()
	q.Replayed, q.Limit, q.AfterID = p.boolean("replayed"), p.limit(), p.afterID()
	return q
}

func (s *Server) apiDeadLetters(w http.ResponseWriter, r *http.Request) {
	p := newParams(r)
	q := lettersQuery(p)
	if err := p.done(); err != nil {
		s.badRequest(w, r, err)
		return
	}
	out, next, err := s.listLetters(r, q)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, page{Data: out, Next: next})
}

func (s *Server) letter(ctx context.Context, id int64) (*DeadLetter, error) {
	l, err := s.letters.Get(ctx, s.pool, id)
	if err != nil {
		return nil, err
	}
	replays, err := s.audit.Of(ctx, s.pool, ActionReplay, strconv.FormatInt(id, 10))
	if err != nil {
		return nil, err
	}
	if replays == nil {
		replays = []Entry{}
	}
	return &DeadLetter{
		DeadLetterBrief: briefOf(l), Scope: l.Scope, Payload: encodeBody(l.Payload),
		Headers: stripHeaders(l.Headers), Replays: replays,
	}, nil
}

func (s *Server) apiDeadLetter(w http.ResponseWriter, r *http.Request) {
	if s.noParams(w, r) {
		return
	}
	id, err := pathID(r, "id")
	if err != nil {
		s.badRequest(w, r, err)
		return
	}
	l, err := s.letter(r.Context(), id)
	if errors.Is(err, deadletter.ErrNotFound) {
		s.notFound(w, r, fmt.Sprintf("no dead letter %d (never written, or pruned)", id))
		return
	}
	if err != nil {
		s.internal(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, l)
}

// ReplayResult is the outcome of one replay.
type ReplayResult struct {
	ID int64 `json:"id"`
	// Outcome is replayed, or failed (Error says why; nothing was committed, the letter can
	// be replayed again once the cause is fixed).
	Outcome string `json:"outcome"`
	// Effect, for a replay that committed, is what it did with the letter's message:
	// applied (its effect ran again), stale (the stale-event guard skipped it: a newer
	// version of its entity was applied meanwhile) or requeued (its event went back to the
	// relay or the deliverer).
	Effect string `json:"effect,omitempty"`
	// Done says what the replay did (through which door, with which operation id).
	Done  string `json:"done,omitempty"`
	Error string `json:"error,omitempty"`
}

// Replay outcomes.
const (
	ReplayReplayed = "replayed"
	ReplayFailed   = "failed"
	ReplaySkipped  = "skipped"
)

// DeadLetter returns one letter as the API shows it: payload, headers with secrets
// stripped, URLs redacted, and its audited replays.
func (s *Server) DeadLetter(ctx context.Context, id int64) (*DeadLetter, error) {
	return s.letter(ctx, id)
}

// replayOne replays letter id and audits it. It returns the audited outcome and the
// replayer's error.
func (s *Server) replayOne(ctx context.Context, actor string, id int64, requestID uuid.UUID, bulk bool) (string, deadletter.Replayed, error) {
	done, err := s.cfg.Replayer.Replay(ctx, id)
	return s.recordReplay(ctx, actor, id, requestID, bulk, err), done, err
}

// RecordReplay audits and logs a replay of letter id made outside the Server (err is its
// result) and returns its outcome, as a replay through the Server would.
func (s *Server) RecordReplay(ctx context.Context, actor string, id int64, err error) string {
	return s.recordReplay(ctx, actor, id, uuid.New(), false, err)
}

func (s *Server) recordReplay(ctx context.Context, actor string, id int64, requestID uuid.UUID, bulk bool, err error) string {
	outcome, detail := ReplayReplayed, ""
	switch {
	case err == nil:
	case errors.Is(err, deadletter.ErrAlreadyReplayed), errors.Is(err, deadletter.ErrNotFound):
		outcome, detail = ReplaySkipped, err.Error()
	default:
		outcome, detail = ReplayFailed, redactURLs(err.Error())
	}
	auditOutcome := map[string]string{ReplayReplayed: OutcomeDone, ReplaySkipped: OutcomeSkipped, ReplayFailed: OutcomeFailed}[outcome]
	target := strconv.FormatInt(id, 10)
	// The audit row is written even when the caller went away: the replay committed.
	if aerr := s.audit.Write(context.WithoutCancel(ctx), s.pool, Entry{
		Actor: actor, Action: ActionReplay, Target: target, Outcome: auditOutcome, Detail: detail, RequestID: requestID,
	}); aerr != nil {
		s.log.WithError(aerr).WithField("dead_letter", id).Error("replay not audited")
	}
	if bulk { // one info line per bulk replay, with its counts
		s.log.WithFields(map[string]any{"actor": actor, "dead_letter": id, "outcome": auditOutcome}).Debug("bulk replay: letter")
	} else {
		s.writeLogged(actor, ActionReplay, target, auditOutcome, err)
	}
	return outcome
}

func (s *Server) apiReplay(w http.ResponseWriter, r *http.Request) {
	if s.noParams(w, r) {
		return
	}
	id, err := pathID(r, "id")
	if err != nil {
		s.badRequest(w, r, err)
		return
	}
	if s.cfg.Replayer == nil {
		s.problem(w, r, http.StatusServiceUnavailable, "unavailable", "Replay unavailable", errNoReplayer.Error())
		return
	}
	outcome, done, err := s.replayOne(r.Context(), actorOf(r), id, uuid.New(), false)
	switch {
	case errors.Is(err, deadletter.ErrNotFound):
		s.notFound(w, r, fmt.Sprintf("no dead letter %d", id))
	case errors.Is(err, deadletter.ErrAlreadyReplayed):
		s.problem(w, r, http.StatusConflict, "already-replayed", "Dead letter already replayed",
			fmt.Sprintf("dead letter %d was replayed before; it is not run again", id))
	default:
		res := ReplayResult{ID: id, Outcome: outcome, Effect: string(done.Outcome), Done: done.Done}
		if err != nil {
			res.Error = redactURLs(err.Error())
		}
		writeJSON(w, http.StatusOK, res)
	}
}

// BulkReplayRequest is the body of POST /api/v1/dead-letters/replay.
type BulkReplayRequest struct {
	LetterFilter
	// DryRun counts the letters the filter matches and replays nothing.
	DryRun bool `json:"dry_run"`
	// All confirms that a run with an empty filter replays every letter not yet replayed;
	// without it such a run is refused (ErrBulkUnfiltered), as `idemd dlq replay` without
	// -all. A dry run needs no filter; with a filter All changes nothing.
	All bool `json:"all,omitempty"`
	// Limit bounds how many letters one call replays (oldest first). Defaults to, and is at
	// most, BulkLimitMax.
	Limit int `json:"limit,omitempty"`
}

// BulkLimitMax bounds the letters of one bulk replay.
const BulkLimitMax = 100_000

// BulkReplayResult counts what a bulk replay did. Matched = Replayed + Skipped + Failed
// (after a real run).
type BulkReplayResult struct {
	// Matched is how many letters not yet replayed the filter selected (at most Limit).
	Matched int64 `json:"matched"`
	// Replayed ran again and were marked replayed, in the same transaction.
	Replayed int64 `json:"replayed"`
	// Skipped were replayed by someone else meanwhile (or pruned): not run again.
	Skipped int64 `json:"skipped"`
	// Failed failed again; nothing of them committed.
	Failed int64 `json:"failed"`
	DryRun bool  `json:"dry_run"`
	// More is true when more letters match than Limit: run again for the rest.
	More bool `json:"more"`
	// Errors are the first failures, by letter.
	Errors []ReplayResult `json:"errors,omitempty"`
	// RequestID groups this replay's rows in the audit.
	RequestID string `json:"request_id,omitempty"`
}

const bulkErrorsShown = 20

// ErrBulkUnfiltered: a bulk replay (not a dry run) with an empty filter, without All.
var ErrBulkUnfiltered = errors.New(`an empty filter selects every letter not yet replayed: name a filter (pipeline, origin, reason, id, since, until), or send "all": true to replay them all`)

// empty says whether f selects every letter.
func (f LetterFilter) empty() bool { return f == LetterFilter{} }

// BulkReplay replays every not-yet-replayed letter f selects, oldest first, each exactly
// once (a letter another replay took meanwhile is skipped). The letters are chosen when it
// starts, so letters written during the run wait for the next one. Each replay is audited
// as actor's. progress, when set, is called after each letter.
func (s *Server) BulkReplay(ctx context.Context, actor string, req BulkReplayRequest, progress func(BulkReplayResult)) (BulkReplayResult, error) {
	if !req.DryRun && !req.All && req.LetterFilter.empty() {
		return BulkReplayResult{}, ErrBulkUnfiltered
	}
	limit := req.Limit
	if limit <= 0 || limit > BulkLimitMax {
		limit = BulkLimitMax
	}
	q := req.query()
	no := false
	q.Replayed, q.Ascending = &no, true
	var ids []int64
	for {
		q.Limit = min(ListLimitMax, limit+1-len(ids))
		ls, err := s.letters.Find(ctx, s.pool, q)
		if err != nil {
			return BulkReplayResult{}, err
		}
		for _, l := range ls {
			ids = append(ids, l.ID)
		}
		if len(ls) < q.Limit || len(ids) > limit {
			break
		}
		q.AfterID = ls[len(ls)-1].ID
	}
	res := BulkReplayResult{DryRun: req.DryRun}
	if len(ids) > limit {
		ids, res.More = ids[:limit], true
	}
	res.Matched = int64(len(ids))
	if req.DryRun {
		return res, nil
	}
	if s.cfg.Replayer == nil {
		return res, errNoReplayer
	}
	requestID := uuid.New()
	res.RequestID = requestID.String()
	defer func() {
		s.log.WithFields(map[string]any{"actor": actor, "request_id": res.RequestID, "matched": res.Matched,
			"replayed": res.Replayed, "skipped": res.Skipped, "failed": res.Failed}).Info("admin write: bulk replay")
	}()
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		outcome, _, err := s.replayOne(ctx, actor, id, requestID, true)
		switch outcome {
		case ReplayReplayed:
			res.Replayed++
		case ReplaySkipped:
			res.Skipped++
		default:
			res.Failed++
			if len(res.Errors) < bulkErrorsShown {
				res.Errors = append(res.Errors, ReplayResult{ID: id, Outcome: outcome, Error: redactURLs(err.Error())})
			}
		}
		if progress != nil {
			progress(res)
		}
	}
	return res, nil
}

// bulkBody is the body of POST /api/v1/dead-letters/replay: the list's filter (id, as the
// list names it, or message_id), dry_run, all and limit. Its values are read as the list's
// parameters are, with the same errors.
type bulkBody struct {
	Pipeline  string `json:"pipeline"`
	Origin    string `json:"origin"`
	Reason    string `json:"reason"`
	ID        string `json:"id"`
	MessageID string `json:"message_id"`
	Since     string `json:"since"`
	Until     string `json:"until"`
	DryRun    bool   `json:"dry_run"`
	All       bool   `json:"all"`
	Limit     int    `json:"limit"`
}

func (b *bulkBody) request() (BulkReplayRequest, error) {
	if b.ID != "" && b.MessageID != "" && b.ID != b.MessageID {
		return BulkReplayRequest{}, errors.New("id and message_id are the same filter: give one")
	}
	p := &params{what: "field", q: url.Values{"pipeline": {b.Pipeline}, "origin": {b.Origin}, "reason": {b.Reason},
		"id": {cmp.Or(b.ID, b.MessageID)}, "since": {b.Since}, "until": {b.Until}}}
	req := BulkReplayRequest{LetterFilter: letterFilter(p), DryRun: b.DryRun, All: b.All, Limit: b.Limit}
	return req, p.done()
}

func (s *Server) apiBulkReplay(w http.ResponseWriter, r *http.Request) {
	if s.noParams(w, r) {
		return
	}
	var body bulkBody
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		s.badRequest(w, r, fmt.Errorf("the body must be a JSON object with the filter (pipeline, origin, reason, id, since, until), dry_run, all and limit: %v", err))
		return
	}
	req, err := body.request()
	if err != nil {
		s.badRequest(w, r, err)
		return
	}
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(bulkWriteTimeout))
	res, err := s.BulkReplay(r.Context(), actorOf(r), req, nil)
	switch {
	case errors.Is(err, ErrBulkUnfiltered):
		s.badRequest(w, r, err)
	case errors.Is(err, errNoReplayer):
		s.problem(w, r, http.StatusServiceUnavailable, "unavailable", "Replay unavailable", err.Error())
	case err != nil && r.Context().Err() == nil:
		s.internal(w, r, err)
	default:
		writeJSON(w, http.StatusOK, res)
	}
}

package admin

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/delivery"
	"github.com/idemd/idemd/outbox"
	"github.com/idemd/idemd/processed"
)

// Outcomes of processed records as the API names them (the outcome filter's values).
const (
	OutcomeProcessed    = "processed"
	OutcomeStale        = "stale"
	OutcomeDeadLettered = "dead_lettered"
	OutcomeInFlight     = "in_flight"
)

// recordOutcome is what a record's outcome is stored as: its state, and for a done record
// whether the stale-event guard skipped its effect (processed.Record.Stale), which the
// receiver answered "stale" rather than "processed".
type recordOutcome struct {
	state processed.State
	stale bool
}

var outcomes = map[string]recordOutcome{
	OutcomeProcessed: {state: processed.StateDone}, OutcomeStale: {state: processed.StateDone, stale: true},
	OutcomeDeadLettered: {state: processed.StateDead}, OutcomeInFlight: {state: processed.StateInFlight},
}

func outcomeOf(rec *processed.Record) string {
	for o, ro := range outcomes {
		if ro.state == rec.State && ro.stale == (rec.Stale != nil) {
			return o
		}
	}
	return string(rec.State)
}

// outcomeFilter narrows f to the records of outcome o ("" for any).
func outcomeFilter(f *processed.RecordFilter, o string) {
	ro, ok := outcomes[o]
	if !ok {
		return
	}
	f.State = ro.state
	if ro.state == processed.StateDone {
		f.Stale = &ro.stale
	}
}

// Message is a processed record as the API shows it.
type Message struct {
	Pipeline       string     `json:"pipeline"`
	Tenant         string     `json:"tenant,omitempty"`
	MessageID      string     `json:"message_id"`
	Status         string     `json:"status"`
	Fingerprint    string     `json:"fingerprint"`
	ResponseStatus *int       `json:"response_status,omitempty"`
	ReceivedAt     time.Time  `json:"received_at"`
	CompletedAt    *time.Time `json:"completed_at,omitempty"`
	ExpiresAt      time.Time  `json:"expires_at"`
	// BodyClaim marks a webhook source's claim of its signed body (processed.BodyScope),
	// listed only with body_claims=true: not a message, and its tenant is none.
	BodyClaim bool `json:"body_claim,omitempty"`
}

func messageOf(rec *processed.Record) Message {
	p, t := processed.ScopeTenant(rec.Scope)
	m := Message{
		Pipeline: p, Tenant: t, MessageID: rec.MessageID, Status: outcomeOf(rec),
		Fingerprint: hex.EncodeToString(rec.Fingerprint), ReceivedAt: rec.ReceivedAt,
		CompletedAt: rec.CompletedAt, ExpiresAt: rec.ExpiresAt,
	}
	if processed.IsBodyClaim(rec.Scope, rec.MessageID, rec.Fingerprint) {
		m.Tenant, m.BodyClaim = "", true
	}
	if rec.Response != nil {
		m.ResponseStatus = &rec.Response.Status
	}
	return m
}

type messageCursor struct {
	ReceivedAt time.Time `json:"t"`
	Scope      string    `json:"s"`
	MessageID  string    `json:"i"`
}

// messageFilter reads the filters of GET /api/v1/messages (and of the console's search).
func messageFilter(p *params) processed.RecordFilter {
	f := processed.RecordFilter{
		Pipeline: p.str("pipeline"), Tenant: p.str("tenant"), MessageID: p.str("id"),
		Since: p.time("since"), Until: p.time("until"), Limit: p.limit(),
	}
	outcomeFilter(&f, p.oneOf("outcome", OutcomeProcessed, OutcomeStale, OutcomeDeadLettered, OutcomeInFlight))
	if b := p.boolean("body_claims"); b != nil {
		f.BodyClaims = *b
	}
	var c messageCursor
	if p.cursor(&c) {
		f.After = &processed.RecordCursor{ReceivedAt: c.ReceivedAt, Scope: c.Scope, MessageID: c.MessageID}
	}
	return f
}

// listMessages runs f and returns the page and its next cursor.
func (s *Server) listMessages(r *http.Request, f processed.RecordFilter) ([]Message, string, error) {
	limit := f.Limit
	f.Limit++
	recs, err := s.processed.ListRecords(r.Context(), s.pool, f)
	if err != nil {
		return nil, "", err
	}
	recs, more := page1(recs, limit)
	out := make([]Message, len(recs))
	for i, rec := range recs {
		out[i] = messageOf(rec)
	}
	next := ""
	if more {
		last := recs[len(recs)-1]
		next = encodeCursor(messageCursor{ReceivedAt: last.ReceivedAt, Scope: last.Scope, MessageID: last.MessageID})
	}
	return out, next, nil
}

func (s *Server) apiMessages(w http.ResponseWriter, r *http.Request) {
	p := newParams(r)
	f := messageFilter(p)
	if err := p.done(); err != nil {
		s.badRequest(w, r, err)
		return
	}
	out, next, err := s.listMessages(r, f)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, page{Data: out, Next: next})
}

// Story is one message's whole story: its record, what its effect did, what it published
// and delivered, and the conflicts and dead letters of its id.
type Story struct {
	Message
	// Response is the stored answer (API sources), replayed to retries.
	Response *StoredResponse `json:"response,omitempty"`
	// Effect says what became of the effect.
	Effect Effect `json:"effect"`
	// Outbox are the message's outbox rows: all of them when OutboxPublishedKept, else
	// only those still to publish (the relay deletes a row once the broker has it).
	Outbox              []OutboxRow       `json:"outbox"`
	OutboxPublishedKept bool              `json:"outbox_published_kept"`
	Deliveries          []Delivery        `json:"deliveries"`
	Conflicts           []Conflict        `json:"conflicts"`
	DeadLetters         []DeadLetterBrief `json:"dead_letters"`
	// OtherTenants are, when the story was asked for without a tenant, the other tenants of
	// the pipeline whose records hold this id (an API source's keys are per tenant), newest
	// first: name one as tenant for its story. Absent when there are none, or a tenant was
	// named.
	OtherTenants []string `json:"other_tenants,omitempty"`
}

// StoredResponse is an answer stored for an API request.
type StoredResponse struct {
	Status  int               `json:"status"`
	Headers map[string]string `json:"headers,omitempty"`
	Body    *body             `json:"body,omitempty"`
}

// Effect is the outcome of a message's effect.
type Effect struct {
	// Outcome is applied, stale (skipped by the stale-event guard), dead_lettered or
	// in_flight.
	Outcome string `json:"outcome"`
	// Attempts is how many times the effect ran, when a dead letter says it.
	Attempts int `json:"attempts,omitempty"`
	// Reason is the dead letter's reason, or why a stale message was skipped.
	Reason string `json:"reason,omitempty"`
	// Entity and Version, for a stale message, are its entity and its version, which was not
	// newer than the entity's last applied one.
	Entity  string `json:"entity,omitempty"`
	Version string `json:"version,omitempty"`
}

// story collects the story of (scope, id).
func (s *Server) story(ctx context.Context, rec *processed.Record) (*Story, error) {
	st := &Story{Message: messageOf(rec), Outbox: []OutboxRow{}, OutboxPublishedKept: s.cfg.OutboxKeepsPublished,
		Deliveries: []Delivery{}, Conflicts: []Conflict{}, DeadLetters: []DeadLetterBrief{}}
	if rec.Response != nil {
		st.Response = &StoredResponse{Status: rec.Response.Status, Headers: rec.Response.Headers, Body: encodeBody(rec.Response.Body)}
	}
	pipeline, tenant := processed.ScopeTenant(rec.Scope)
	switch {
	case rec.State == processed.StateDone && rec.Stale != nil:
		if err := s.staleEffect(ctx, &st.Effect, pipeline, rec.Stale); err != nil {
			return nil, err
		}
	case rec.State == processed.StateDone:
		st.Effect.Outcome = "applied"
	case rec.State == processed.StateDead:
		st.Effect.Outcome = OutcomeDeadLettered
	default:
		st.Effect.Outcome = OutcomeInFlight
	}
	rows, err := s.outbox.Rows(ctx, s.pool, outbox.RowFilter{Pipeline: pipeline, CausationID: rec.MessageID, Limit: ListLimitMax})
	if err != nil {
		return nil, err
	}
	for _, row := range rows {
		st.Outbox = append(st.Outbox, outboxRowOf(row))
	}
	ds, err := s.delivery.Deliveries(ctx, s.pool, delivery.DeliveryFilter{Pipeline: pipeline, CausationID: rec.MessageID, Limit: ListLimitMax})
	if err != nil {
		return nil, err
	}
	// A delivery's dead letter has the delivery's operation id for message id.
	ops := make([]string, 0, len(ds))
	for _, d := range ds {
		st.Deliveries = append(st.Deliveries, deliveryOf(d))
		ops = append(ops, d.OperationID.String())
	}
	cs, err := s.processed.ListConflicts(ctx, s.pool, processed.ConflictFilter{Pipeline: pipeline, Tenant: tenant, MessageID: rec.MessageID, Limit: ListLimitMax})
	if err != nil {
		return nil, err
	}
	for _, c := range cs {
		if c.Scope == rec.Scope {
			st.Conflicts = append(st.Conflicts, conflictOf(c))
		}
	}
	ls, err := s.letters.Find(ctx, s.pool, deadletter.Query{Pipeline: pipeline, MessageID: rec.MessageID, MessageIDs: ops, Limit: ListLimitMax})
	if err != nil {
		return nil, err
	}
	var own *deadletter.Letter // the effect's letter: the oldest of the message's door (Find: newest first)
	for _, l := range ls {
		delivered := l.Origin.Door == deadletter.DoorDelivery
		if delivered != (l.MessageID != rec.MessageID) {
			continue // another door's letter of an id that happens to equal an operation id
		}
		st.DeadLetters = append(st.DeadLetters, briefOf(l))
		if !delivered && l.Origin.Door != deadletter.DoorRelay {
			own = l
		}
	}
	if own != nil && rec.State == processed.StateDead {
		st.Effect.Attempts, st.Effect.Reason = own.Attempts, own.Reason
	}
	return st, nil
}

// staleEffect is the effect of a message of pipeline that the stale-event guard skipped:
// its entity and version, and the version the entity is at now. The doors' guard scope is
// the pipeline's name.
func (s *Server) staleEffect(ctx context.Context, e *Effect, pipeline string, st *processed.Stale) error {
	e.Outcome, e.Entity, e.Version = OutcomeStale, st.Entity, st.Version
	now, err := s.processed.GetEntityVersion(ctx, s.pool, pipeline, st.Entity)
	if err != nil {
		return err
	}
	e.Reason = fmt.Sprintf("version %s of entity %s was not newer than the last applied one", st.Version, quote(st.Entity))
	if now != nil {
		e.Reason += fmt.Sprintf("; the entity is at version %s now, applied by message %s at %s",
			now.Version, quote(now.MessageID), now.UpdatedAt.UTC().Format(time.RFC3339))
	}
	return nil
}

// Story returns the whole story of message id of pipeline. tenant picks an API source's
// tenant (one lookup by key); without it, the story is the newest record's of the id in the
// pipeline, and OtherTenants lists the tenants of the others. It fails with
// processed.ErrNotFound when there is no record.
func (s *Server) Story(ctx context.Context, pipeline, id, tenant string) (*Story, error) {
	if tenant != "" {
		rec, err := s.processed.GetRecord(ctx, s.pool, processed.Scope(pipeline, tenant), id)
		if err != nil {
			return nil, err
		}
		return s.story(ctx, rec)
	}
	// Every record of the id in the pipeline: one probe per scope, as the list's search.
	recs, err := s.processed.ListRecords(ctx, s.pool, processed.RecordFilter{Pipeline: pipeline, MessageID: id, Limit: storyTenantsMax, BodyClaims: true})
	if err != nil {
		return nil, err
	}
	if len(recs) == 0 {
		return nil, processed.ErrNotFound
	}
	st, err := s.story(ctx, recs[0])
	if err != nil {
		return nil, err
	}
	for _, r := range recs[1:] {
		if !processed.IsBodyClaim(r.Scope, r.MessageID, r.Fingerprint) {
			_, t := processed.ScopeTenant(r.Scope)
			st.OtherTenants = append(st.OtherTenants, t)
		}
	}
	return st, nil
}

// storyTenantsMax bounds the records of one id that a story reads (its tenants).
const storyTenantsMax = 100

func (s *Server) apiMessage(w http.ResponseWriter, r *http.Request) {
	pipeline, id := r.PathValue("pipeline"), r.PathValue("id")
	p := newParams(r)
	tenant := p.str("tenant")
	if err := p.done(); err != nil {
		s.badRequest(w, r, err)
		return
	}
	st, err := s.Story(r.Context(), pipeline, id, tenant)
	if errors.Is(err, processed.ErrNotFound) {
		s.notFound(w, r, "no record of message "+quote(id)+" in pipeline "+quote(pipeline)+" (never received, or pruned after its retention)")
		return
	}
	if err != nil {
		s.internal(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// Conflict is a recorded conflict as the API shows it.
type Conflict struct {
	Pipeline            string     `json:"pipeline"`
	Tenant              string     `json:"tenant,omitempty"`
	MessageID           string     `json:"message_id"`
	StoredFingerprint   string     `json:"stored_fingerprint"`
	IncomingFingerprint string     `json:"incoming_fingerprint"`
	Count               int64      `json:"count"`
	FirstSeenAt         time.Time  `json:"first_seen_at"`
	LastSeenAt          time.Time  `json:"last_seen_at"`
	ExpiresAt           *time.Time `json:"expires_at,omitempty"`
	Payload             *body      `json:"payload,omitempty"`
	PayloadTruncated    bool       `json:"payload_truncated"`
}

func conflictOf(c *processed.ConflictRecord) Conflict {
	p, t := processed.ScopeTenant(c.Scope)
	return Conflict{
		Pipeline: p, Tenant: t, MessageID: c.MessageID,
		StoredFingerprint: hex.EncodeToString(c.StoredFingerprint), IncomingFingerprint: hex.EncodeToString(c.IncomingFingerprint),
		Count: c.Count, FirstSeenAt: c.FirstSeenAt, LastSeenAt: c.LastSeenAt, ExpiresAt: c.ExpiresAt,
		Payload: encodeBody(c.Payload), PayloadTruncated: c.PayloadTruncated,
	}
}

type conflictCursor struct {
	FirstSeenAt time.Time `json:"t"`
	Scope       string    `json:"s"`
	MessageID   string    `json:"i"`
	Incoming    []byte    `json:"f"`
}

func conflictFilter(p *params) processed.ConflictFilter {
	f := processed.ConflictFilter{Pipeline: p.str("pipeline"), Tenant: p.str("tenant"), MessageID: p.str("id"), Since: p.time("since"), Limit: p.limit()}
	var c conflictCursor
	if p.cursor(&c) {
		f.After = &processed.ConflictCursor{FirstSeenAt: c.FirstSeenAt, Scope: c.Scope, MessageID: c.MessageID, IncomingFingerprint: c.Incoming}
	}
	return f
}

func (s *Server) listConflicts(r *http.Request, f processed.ConflictFilter) ([]Conflict, string, error) {
	limit := f.Limit
	f.Limit++
	cs, err := s.processed.ListConflicts(r.Context(), s.pool, f)
	if err != nil {
		return nil, "", err
	}
	cs, more := page1(cs, limit)
	out := make([]Conflict, len(cs))
	for i, c := range cs {
		out[i] = conflictOf(c)
	}
	next := ""
	if more {
		last := cs[len(cs)-1]
		next = encodeCursor(conflictCursor{FirstSeenAt: last.FirstSeenAt, Scope: last.Scope, MessageID: last.MessageID, Incoming: last.IncomingFingerprint})
	}
	return out, next, nil
}

func (s *Server) apiConflicts(w http.ResponseWriter, r *http.Request) {
	p := newParams(r)
	f := conflictFilter(p)
	if err := p.done(); err != nil {
		s.badRequest(w, r, err)
		return
	}
	out, next, err := s.listConflicts(r, f)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, page{Data: out, Next: next})
}

func quote(s string) string { return strconv.Quote(s) }

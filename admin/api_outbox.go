package admin

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/delivery"
	"github.com/idemd/idemd/outbox"
)

// OutboxRow is an outbox row as the API shows it.
type OutboxRow struct {
	ID          int64             `json:"id"`
	OperationID string            `json:"operation_id"`
	Pipeline    string            `json:"pipeline"`
	CausationID string            `json:"causation_id"`
	Topic       string            `json:"topic"`
	Key         *body             `json:"key,omitempty"`
	Payload     *body             `json:"payload"`
	Headers     map[string]string `json:"headers"`
	CreatedAt   time.Time         `json:"created_at"`
	PublishedAt *time.Time        `json:"published_at,omitempty"`
}

func outboxRowOf(r *outbox.Row) OutboxRow {
	return OutboxRow{
		ID: r.ID, OperationID: r.OperationID.String(), Pipeline: r.Pipeline, CausationID: r.CausationID, Topic: r.Topic,
		Key: encodeBody(r.Key), Payload: encodeBody(r.Payload), Headers: r.Headers, CreatedAt: r.CreatedAt, PublishedAt: r.PublishedAt,
	}
}

func outboxFilter(p *params) outbox.RowFilter {
	f := outbox.RowFilter{Topic: p.str("topic"), Pipeline: p.str("pipeline"), CausationID: p.str("causation_id"), Limit: p.limit(), AfterID: p.afterID()}
	if v := p.str("operation_id"); v != "" {
		op, err := uuid.Parse(v)
		if err != nil {
			p.fail("operation_id", "%q is not a UUID", v)
		}
		f.OperationID = op
	}
	// unpublished=false keeps the published rows, which exist only while the relay keeps
	// them (IDEMD_OUTBOX_KEEP_PUBLISHED); absent, both kinds.
	if b := p.boolean("unpublished"); b != nil {
		f.Unpublished, f.Published = *b, !*b
	}
	return f
}

func (s *Server) listOutbox(r *http.Request, f outbox.RowFilter) ([]OutboxRow, string, error) {
	limit := f.Limit
	f.Limit++
	rows, err := s.outbox.Rows(r.Context(), s.pool, f)
	if err != nil {
		return nil, "", err
	}
	rows, more := page1(rows, limit)
	out := make([]OutboxRow, len(rows))
	var last int64
	for i, row := range rows {
		out[i], last = outboxRowOf(row), row.ID
	}
	return out, nextID(more, last), nil
}

func (s *Server) apiOutbox(w http.ResponseWriter, r *http.Request) {
	p := newParams(r)
	f := outboxFilter(p)
	if err := p.done(); err != nil {
		s.badRequest(w, r, err)
		return
	}
	out, next, err := s.listOutbox(r, f)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, page{Data: out, Next: next})
}

// Backlog is the unpublished part of the outbox for one topic.
type Backlog struct {
	Topic           string    `json:"topic"`
	Unpublished     int64     `json:"unpublished"`
	OldestID        int64     `json:"oldest_id"`
	OldestCreatedAt time.Time `json:"oldest_created_at"`
	// OldestAgeSeconds is the age of the oldest unpublished row.
	OldestAgeSeconds float64 `json:"oldest_age_seconds"`
}

func (s *Server) backlog(r *http.Request) ([]Backlog, error) {
	bs, err := s.outbox.Backlog(r.Context(), s.pool)
	if err != nil {
		return nil, err
	}
	out := make([]Backlog, len(bs))
	now := time.Now()
	for i, b := range bs {
		out[i] = Backlog{Topic: b.Topic, Unpublished: b.Unpublished, OldestID: b.OldestID, OldestCreatedAt: b.OldestCreatedAt,
			OldestAgeSeconds: max(0, now.Sub(b.OldestCreatedAt).Seconds())}
	}
	return out, nil
}

func (s *Server) apiBacklog(w http.ResponseWriter, r *http.Request) {
	if s.noParams(w, r) {
		return
	}
	out, err := s.backlog(r)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, page{Data: out})
}

// Delivery is an outbound HTTP delivery as the API shows it.
type Delivery struct {
	ID            int64      `json:"id"`
	Endpoint      string     `json:"endpoint"`
	OperationID   string     `json:"operation_id"`
	Pipeline      string     `json:"pipeline"`
	CausationID   string     `json:"causation_id"`
	State         string     `json:"state"`
	Attempts      int        `json:"attempts"`
	NextAttemptAt time.Time  `json:"next_attempt_at"`
	LastStatus    *int       `json:"last_status,omitempty"`
	LastError     string     `json:"last_error,omitempty"`
	CreatedAt     time.Time  `json:"created_at"`
	FinishedAt    *time.Time `json:"finished_at,omitempty"`
}

func deliveryOf(d *delivery.Delivery) Delivery {
	return Delivery{
		ID: d.ID, Endpoint: d.Endpoint, OperationID: d.OperationID.String(), Pipeline: d.Pipeline, CausationID: d.CausationID,
		State: d.State, Attempts: d.Attempts, NextAttemptAt: d.NextAttemptAt, LastStatus: d.LastStatus,
		LastError: redactURLs(d.LastError), CreatedAt: d.CreatedAt, FinishedAt: d.FinishedAt,
	}
}

func deliveryFilter(p *params) delivery.DeliveryFilter {
	return delivery.DeliveryFilter{
		Endpoint: p.str("endpoint"), State: p.oneOf("state", "pending", "delivered", "dead"), Pipeline: p.str("pipeline"),
		CausationID: p.str("causation_id"), Limit: p.limit(), AfterID: p.afterID(),
	}
}

func (s *Server) listDeliveries(r *http.Request, f delivery.DeliveryFilter) ([]Delivery, string, error) {
	limit := f.Limit
	f.Limit++
	ds, err := s.delivery.Deliveries(r.Context(), s.pool, f)
	if err != nil {
		return nil, "", err
	}
	ds, more := page1(ds, limit)
	out := make([]Delivery, len(ds))
	var last int64
	for i, d := range ds {
		out[i], last = deliveryOf(d), d.ID
	}
	return out, nextID(more, last), nil
}

func (s *Server) apiDeliveries(w http.ResponseWriter, r *http.Request) {
	p := newParams(r)
	f := deliveryFilter(p)
	if err := p.done(); err != nil {
		s.badRequest(w, r, err)
		return
	}
	out, next, err := s.listDeliveries(r, f)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, page{Data: out, Next: next})
}

// Endpoint is an outbound HTTP endpoint as the API shows it (its URL reduced to scheme,
// host and port: the rest may be a capability).
type Endpoint struct {
	Name            string     `json:"name"`
	URL             string     `json:"url"`
	Disabled        bool       `json:"disabled"`
	DisabledAt      *time.Time `json:"disabled_at,omitempty"`
	DisabledReason  string     `json:"disabled_reason,omitempty"`
	Pending         int64      `json:"pending"`
	Dead            int64      `json:"dead"`
	Delivered       int64      `json:"delivered"`
	OldestPendingAt *time.Time `json:"oldest_pending_at,omitempty"`
}

func (s *Server) endpoints(r *http.Request) ([]Endpoint, error) {
	es, err := s.delivery.Endpoints(r.Context(), s.pool)
	if err != nil {
		return nil, err
	}
	out := make([]Endpoint, len(es))
	for i, e := range es {
		out[i] = Endpoint{Name: e.Name, URL: redactURLs(e.URL), Disabled: e.DisabledAt != nil, DisabledAt: e.DisabledAt,
			DisabledReason: redactURLs(e.DisabledReason), Pending: e.Pending, Dead: e.Dead, Delivered: e.Delivered,
			OldestPendingAt: e.OldestPendingAt}
	}
	return out, nil
}

func (s *Server) apiEndpoints(w http.ResponseWriter, r *http.Request) {
	if s.noParams(w, r) {
		return
	}
	out, err := s.endpoints(r)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, page{Data: out})
}

// setEndpoint disables or enables an endpoint, logged and audited.
func (s *Server) setEndpoint(ctx context.Context, actor, name string, disable bool) error {
	action := ActionEndpointEnable
	var err error
	if disable {
		action = ActionEndpointDisable
		err = s.delivery.Disable(ctx, s.pool, name, "disabled by "+actor+" through the admin API")
	} else {
		err = s.delivery.Enable(ctx, s.pool, name)
	}
	s.audited(ctx, actor, action, name, err)
	return err
}

// audited logs and audits a write that is not a replay.
func (s *Server) audited(ctx context.Context, actor, action, target string, err error) {
	outcome, detail := OutcomeDone, ""
	if err != nil {
		outcome, detail = OutcomeFailed, err.Error()
	}
	if aerr := s.audit.Write(ctx, s.pool, Entry{Actor: actor, Action: action, Target: target, Outcome: outcome, Detail: detail}); aerr != nil {
		s.log.WithError(aerr).WithField("action", action).Error("write not audited")
	}
	s.writeLogged(actor, action, target, outcome, err)
}

func (s *Server) apiSetEndpoint(w http.ResponseWriter, r *http.Request, disable bool) {
	if s.noParams(w, r) {
		return
	}
	name := r.PathValue("name")
	err := s.setEndpoint(r.Context(), actorOf(r), name, disable)
	switch {
	case errors.Is(err, delivery.ErrNotFound):
		s.notFound(w, r, fmt.Sprintf("no endpoint %q (endpoints appear once a deliverer registered them)", name))
	case err != nil:
		s.internal(w, r, err)
	default:
		writeJSON(w, http.StatusOK, map[string]any{"name": name, "disabled": disable})
	}
}

func (s *Server) apiDisable(w http.ResponseWriter, r *http.Request) { s.apiSetEndpoint(w, r, true) }
func (s *Server) apiEnable(w http.ResponseWriter, r *http.Request)  { s.apiSetEndpoint(w, r, false) }

// requeue makes a finished delivery pending again (same operation id), logged and audited.
func (s *Server) requeue(ctx context.Context, actor string, id int64) error {
	// RequeueTx refuses a pending delivery: clearing its lease could send it twice.
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error { return s.delivery.RequeueTx(ctx, tx, id) })
	s.audited(ctx, actor, ActionDeliveryRequeue, strconv.FormatInt(id, 10), err)
	return err
}

func (s *Server) apiRequeue(w http.ResponseWriter, r *http.Request) {
	if s.noParams(w, r) {
		return
	}
	id, err := pathID(r, "id")
	if err != nil {
		s.badRequest(w, r, err)
		return
	}
	err = s.requeue(r.Context(), actorOf(r), id)
	switch {
	case errors.Is(err, delivery.ErrNotFound):
		s.notFound(w, r, fmt.Sprintf("no delivery %d", id))
	case errors.Is(err, delivery.ErrPending):
		s.problem(w, r, http.StatusConflict, "delivery-pending", "Delivery still pending", "a pending delivery is already queued; requeueing it could send it twice")
	case err != nil:
		s.internal(w, r, err)
	default:
		writeJSON(w, http.StatusOK, map[string]any{"id": id, "state": "pending"})
	}
}

package receiver

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sirupsen/logrus"

	"github.com/idemd/idemd/exactlyonce"
	"github.com/idemd/idemd/internal/effectsql"
	"github.com/idemd/idemd/internal/fingerprint"
	"github.com/idemd/idemd/processed"
)

// An API source answers on {path}/{item} as well as on {path}:
//   - PUT {path}/{key}: a request whose idempotency key is in the URL (serveAPI);
//   - GET {path}/{key}, with Idempotency.Lookup: the stored answer of a key (serveLookup);
//   - DELETE {path}/{id}, with Delete: a delete effect, once per (tenant, id) (serveDelete).
//
// PATCH is not served: a patch that applies a relative change ("add 1", "append") is not
// safe to retry without a key, and one with a key is a POST or PUT with an Idempotency-Key.
// Only absolute changes ("set the status to shipped") may be retried as they are.

// action is what a request asks of its source.
type action int

const (
	actApply  action = iota // POST {path}, PUT {path}/{key}
	actLookup               // GET {path}/{key}
	actDelete               // DELETE {path}/{id}
)

// itemAction is the action of method on {path}/{item}; ok is false for a method the source
// does not serve there.
func (s *source) itemAction(method string) (action, bool) {
	switch {
	case method == http.MethodPut:
		return actApply, true
	case method == http.MethodGet && s.lookup:
		return actLookup, true
	case method == http.MethodDelete && s.del != nil:
		return actDelete, true
	}
	return 0, false
}

// itemMethods lists the methods the source serves on {path}/{item}, for Allow.
func (s *source) itemMethods() string {
	m := []string{http.MethodPut}
	if s.lookup {
		m = append(m, http.MethodGet)
	}
	if s.del != nil {
		m = append(m, http.MethodDelete)
	}
	return strings.Join(m, ", ")
}

// compileAPI checks and compiles what an API source serves beside POST and PUT.
func (s *source) compileAPI(ctx context.Context, pool *pgxpool.Pool, src Source) error {
	if src.Idempotency != nil {
		s.lookup = src.Idempotency.Lookup
	}
	if src.Delete == nil {
		return nil
	}
	if !s.api {
		return errors.New("delete: DELETE {path}/{id} is served by API sources only: set idempotency")
	}
	if strings.TrimSpace(src.Delete.SQL) == "" {
		return errors.New("delete.sql is required")
	}
	stmt, err := compile(ctx, pool, src.Delete.SQL)
	if err != nil {
		return fmt.Errorf("delete.sql does not prepare: %w", err)
	}
	s.del = stmt
	return nil
}

// serveLookup answers GET {path}/{key}: the stored answer of key in the caller's tenant,
// byte for byte with Idempotent-Replayed: true; 404 when the key has no answer (never seen,
// or past its retention); 409 while its request is in flight. It never runs an effect.
func (r *Receiver) serveLookup(w http.ResponseWriter, req *http.Request, c *call, key string, log *logrus.Entry) {
	src := c.src
	if !ValidKey(key) {
		r.reject(w, src, probBadKey, ErrInvalidKey.Error(), "bad_key")
		return
	}
	ctx, cancel := context.WithTimeout(req.Context(), r.cfg.ApplyTimeout)
	defer cancel()
	// The scope holds the tenant: another tenant's key is simply not found.
	rec, err := r.processed.GetRecord(ctx, r.pool, c.scope, key)
	switch {
	case errors.Is(err, processed.ErrNotFound), err == nil && !rec.ExpiresAt.After(time.Now()):
		writeProblem(w, probUnknownKey, "no request with this Idempotency-Key is stored for this tenant", key, 0)
	case err != nil:
		src.failures.error(log, err, "looking up an idempotency key failed; answered 503")
		writeProblem(w, probUnavailable, "retry later", key, 1)
	case rec.State == processed.StateInFlight:
		writeProblem(w, probInFlight, "the request with this Idempotency-Key is being processed; look it up again later", key, 1)
	default:
		writeStored(w, rec.Response, key)
	}
}

// serveDelete runs DELETE {path}/{id}: the source's delete effect, once per (tenant, id),
// through the same reservation flow as the source's other requests. Its answer is stored
// and every retry gets it back: 204 when the statement affected rows on its first run, 404
// (nothing-to-delete) when it affected none.
func (r *Receiver) serveDelete(w http.ResponseWriter, req *http.Request, c *call, id string, log *logrus.Entry) {
	src := c.src
	if !processed.ValidID(id) {
		r.reject(w, src, probMissingID, "the id is not 1 to 255 bytes of text without control characters", "bad_message_id")
		return
	}
	c.req.Key, c.req.MessageID = id, id
	log = log.WithField("message_id", id)
	if c.req.Tenant != "" {
		log = log.WithField("tenant", c.req.Tenant)
	}
	v := &effectsql.Values{
		MessageID: id, Key: []byte(id), Payload: c.req.Body, Headers: firstValues(c.req.Header),
		Source: src.name, Tenant: c.req.Tenant, ReceivedAt: c.req.ReceivedAt,
	}
	m := &exactlyonce.Message{
		// Deletes have their own scope: an id to delete is not a key of the source's POSTs.
		Scope: processed.Scope(src.name+":delete", c.req.Tenant), ID: id,
		Fingerprint: fingerprint.Request(c.req.Method, c.req.Path, c.req.Body),
		Payload:     c.req.Body,
		Retention:   src.retention,
		MaxAttempts: src.maxAttempts,
		Effect:      exactlyonce.Effect{SQL: src.del.SQL, Args: src.del.Bind(v)},
		Answer: &exactlyonce.Answer{
			Status: http.StatusNoContent,
			NoRows: &processed.Response{
				Status:  probNothingToDel.Status,
				Headers: map[string]string{"Content-Type": "application/problem+json"},
				Body:    problemBody(probNothingToDel, "the delete affected no rows: nothing with this id exists for this tenant", id),
			},
			Failed: src.failedAnswer(id),
		},
	}
	r.applyReserved(w, req, c, m, id, log)
}

// failedAnswer builds the stored answer of a request whose effect failed permanently.
func (s *source) failedAnswer(key string) func(error) *processed.Response {
	return func(cause error) *processed.Response {
		return &processed.Response{
			Status:  probEffectFailed.Status,
			Headers: map[string]string{"Content-Type": "application/problem+json"},
			Body:    problemBody(probEffectFailed, effectFailure(cause), key),
		}
	}
}

// firstValues keeps the first value of each header (the @headers parameter).
func firstValues(h map[string][]string) map[string]string {
	out := make(map[string]string, len(h))
	for k, v := range h {
		if len(v) > 0 {
			out[k] = v[0]
		}
	}
	return out
}

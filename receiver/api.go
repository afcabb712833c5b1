package receiver

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/idemd/idemd/exactlyonce"
	"github.com/idemd/idemd/internal/metrics"
	"github.com/idemd/idemd/internal/pgerr"
	"github.com/idemd/idemd/processed"
)

// serveAPI applies one API request under the Idempotency-Key contract (SPEC 2.4):
//
//  1. reserve the key in a short committed transaction, so that a concurrent retry sees it
//     in flight (409, or 422 when its payload differs) instead of blocking;
//  2. run the effect in a second transaction that locks the reservation, and store the
//     response (or the 422 of a permanent failure) with it;
//  3. answer only after that commit. A retry gets the stored response, byte for byte.
func (r *Receiver) serveAPI(w http.ResponseWriter, req *http.Request, c *call, urlKey string, log *logrus.Entry) {
	src := c.src
	// A PUT's key is its URL's. An Idempotency-Key header beside it is not used: the URL
	// names the resource, and the idempotent clients send a header on every request.
	key := urlKey
	if key == "" {
		k, err := ParseIdempotencyKey(req.Header.Values("Idempotency-Key"))
		switch {
		case errors.Is(err, ErrNoKey) && !src.required:
			k = autoKey()
		case errors.Is(err, ErrNoKey):
			r.reject(w, src, probMissingKey, "send one Idempotency-Key per logical operation", "missing_key")
			return
		case err != nil:
			r.reject(w, src, probBadKey, err.Error(), "bad_key")
			return
		}
		key = k
	} else if !ValidKey(key) {
		r.reject(w, src, probBadKey, ErrInvalidKey.Error(), "bad_key")
		return
	}
	c.req.Key, c.req.MessageID = key, key
	log = log.WithField("message_id", key)
	if c.req.Tenant != "" {
		log = log.WithField("tenant", c.req.Tenant)
	}
	log.WithField("payload", string(c.req.Body)).Debug("API request authenticated")

	r.applyReserved(w, req, c, c.src.message(c), key, log)
}

// applyReserved applies m, an API request's message, under the Idempotency-Key contract and
// answers: a stored answer for a retry, 409 while the key is in flight, 422 for a conflict,
// otherwise the answer the unit built and stored with the effect.
func (r *Receiver) applyReserved(w http.ResponseWriter, req *http.Request, c *call, m *exactlyonce.Message, key string, log *logrus.Entry) {
	src := c.src
	wait := preferWait(req.Header.Values("Prefer"), r.cfg.MaxWait)
	// The reservation and the effect run on their own contexts: a client that hangs up
	// mid-way must not leave half a state behind.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(req.Context()), r.cfg.ApplyTimeout+wait)
	defer cancel()
	defer noteMessage(c.span, m)
	token, err := r.unit.Reserve(ctx, m, wait)
	if err != nil {
		src.failures.error(log, err, "reserving an idempotency key failed; answered 503")
		writeProblem(w, probUnavailable, "retry later with the same Idempotency-Key", key, 1)
		return
	}
	switch m.Outcome {
	case exactlyonce.Duplicate:
		metrics.Duplicates.WithLabelValues(src.name).Inc()
		writeStored(w, m.Response, key)
		return
	case exactlyonce.Conflict:
		metrics.Conflicts.WithLabelValues(src.name).Inc()
		log.WithField("conflict_count", m.ConflictCount).Warn("idempotency key reused with a different request; recorded")
		writeProblem(w, probConflict, "this Idempotency-Key was used with a different request", key, 0)
		return
	case exactlyonce.InFlight:
		metrics.InFlight.WithLabelValues(src.name).Inc()
		writeProblem(w, probInFlight, "a request with this Idempotency-Key is being processed; retry later or send Prefer: wait=N", key, 1)
		return
	}
	err = r.unit.ApplyReserved(ctx, m, token)
	switch {
	case errors.Is(err, processed.ErrLeaseLost):
		metrics.InFlight.WithLabelValues(src.name).Inc()
		log.Warn("reservation lease expired and was taken over; answered 409")
		writeProblem(w, probInFlight, "a request with this Idempotency-Key is being processed; retry later", key, 1)
	case err != nil:
		src.failures.error(log, err, "API transaction failed; answered 503, nothing stored")
		writeProblem(w, probUnavailable, "retry later with the same Idempotency-Key", key, 1)
	case m.Outcome == exactlyonce.DeadLettered:
		metrics.DeadLettered.WithLabelValues(src.name).Inc()
		log.WithField("reason", pgerr.ForLog(m.Cause, log.Logger.IsLevelEnabled(logrus.DebugLevel))).
			Warn("API effect failed permanently; 422 stored (the database's own words are logged at debug level)")
		writeStored(w, m.Response, "")
	default:
		metrics.Processed.WithLabelValues(src.name).Inc()
		if m.Response != nil && m.Response.Status/100 != 2 {
			log.WithField("status", m.Response.Status).Info("API effect answered with a non-2xx status; stored")
		}
		writeStored(w, m.Response, "")
	}
}

// effectFailure describes a permanent failure without echoing data: the SQLSTATE class only.
func effectFailure(err error) string {
	if code := pgerr.Code(err); code != "" {
		return "the effect was rejected by the database (SQLSTATE " + code + "); retrying the same request will fail the same way"
	}
	return "the effect failed permanently; retrying the same request will fail the same way"
}

// writeStored answers with a stored response. replayKey != "" marks it a replay.
func writeStored(w http.ResponseWriter, resp *processed.Response, replayKey string) {
	if resp == nil {
		writeJSON(w, http.StatusOK, statusBody("duplicate", replayKey), replayKey != "")
		return
	}
	h := w.Header()
	for k, v := range resp.Headers {
		h.Set(k, v)
	}
	if replayKey != "" {
		h.Set("Idempotent-Replayed", "true")
	}
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

// preferWait reads "Prefer: wait=N" (RFC 7240), capped at max. N is compared with max in
// seconds: N × time.Second overflows a Duration from N = 9223372037 on, which used to make
// the wait negative (and the request's deadline already past).
func preferWait(values []string, max time.Duration) time.Duration {
	for _, v := range values {
		for _, pref := range strings.Split(v, ",") {
			name, val, ok := strings.Cut(strings.TrimSpace(pref), "=")
			if !ok || !strings.EqualFold(strings.TrimSpace(name), "wait") {
				continue
			}
			n, err := strconv.ParseInt(strings.Trim(strings.TrimSpace(val), `"`), 10, 64)
			switch {
			case errors.Is(err, strconv.ErrRange) && n > 0, err == nil && n > int64(max/time.Second):
				return max
			case err != nil || n <= 0:
				return 0
			}
			return time.Duration(n) * time.Second
		}
	}
	return 0
}

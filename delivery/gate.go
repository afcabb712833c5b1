package delivery

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/sirupsen/logrus"
)

// The gate of an endpoint with a Rate or a Breaker: before claiming rows, a deliverer locks
// the endpoint's http_endpoints row, reads the breaker and the rate budget there, claims at
// most what they allow, and writes them back, in one transaction. The state is shared by
// every deliverer and survives restarts; the row lock makes the budget exact across
// processes. Endpoints without either claim without the gate, as before.

// gateState is an endpoint's gate as read under its row lock.
type gateState struct {
	openUntil, probeUntil *time.Time
	tokens                *float64
	at                    *time.Time
	now                   time.Time
}

// admission is what the gate lets a claim take.
type admission struct {
	// n is how many rows may be claimed now.
	n int
	// probe: the claim is the half-open breaker's one probe.
	probe bool
	// wait, when n is 0, is how long until the gate may let something through.
	wait time.Duration
	// tokens is the budget left before the claim (rate endpoints).
	tokens float64
}

// admit decides how many of free rows the gate lets through at s.now.
func (ep *endpoint) admit(s gateState, free int) admission {
	a := admission{n: free}
	if ep.Breaker != nil && s.openUntil != nil {
		switch {
		case s.now.Before(*s.openUntil):
			return admission{wait: s.openUntil.Sub(s.now)}
		case s.probeUntil != nil && s.now.Before(*s.probeUntil):
			return admission{wait: s.probeUntil.Sub(s.now)} // another deliverer's probe is out
		}
		a.n, a.probe = 1, true
	}
	if ep.Rate > 0 {
		capacity := max(1, ep.Rate)
		a.tokens = capacity
		if s.tokens != nil && s.at != nil {
			a.tokens = min(capacity, *s.tokens+ep.Rate*s.now.Sub(*s.at).Seconds())
		}
		if whole := int(math.Floor(a.tokens)); whole < a.n {
			a.n = whole
		}
		if a.n == 0 {
			a.probe = false
			a.wait = time.Duration((1 - a.tokens) / ep.Rate * float64(time.Second))
		}
	}
	return a
}

// claimGated claims up to free rows of ep through its gate, and returns how long to wait
// when the gate let nothing through.
func (d *Deliverer) claimGated(ctx context.Context, ep *endpoint, free int) (rows []*row, wait time.Duration, err error) {
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return nil, 0, fmt.Errorf("error claiming deliveries: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	var s gateState
	if err := tx.QueryRow(ctx, d.sql.gate, ep.Name).Scan(&s.openUntil, &s.probeUntil, &s.tokens, &s.at, &s.now); err != nil {
		return nil, 0, fmt.Errorf("error reading the endpoint's gate: %w", err)
	}
	breakerOpen.WithLabelValues(ep.Name).Set(boolGauge(s.openUntil != nil))
	a := ep.admit(s, free)
	if a.n > 0 {
		if rows, err = d.claimIn(ctx, tx, ep, a.n); err != nil {
			return nil, 0, err
		}
	}
	var probeUntil *time.Time
	if a.probe && len(rows) > 0 {
		t := s.now.Add(ep.Timeout + d.cfg.LeaseMargin)
		probeUntil = &t
		breakerTransitions.WithLabelValues(ep.Name, "half_open").Inc()
		d.log.WithField("endpoint", ep.Name).Info("circuit breaker half-open: sending one probe")
	}
	var tokens *float64
	if ep.Rate > 0 {
		left := a.tokens - float64(len(rows))
		tokens = &left
	}
	if _, err := tx.Exec(ctx, d.sql.gateUpdate, ep.Name, tokens, s.now, probeUntil); err != nil {
		return nil, 0, fmt.Errorf("error updating the endpoint's gate: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, 0, fmt.Errorf("error claiming deliveries: %w", err)
	}
	return rows, a.wait, nil
}

// breakerVerdict is what an attempt says of its endpoint's health.
type breakerVerdict int

const (
	// verdictNone: nothing was sent (the request could not be built).
	verdictNone breakerVerdict = iota
	// verdictFailed: no answer, a timeout, 408, 425, 429 or 5xx.
	verdictFailed
	// verdictAnswered: any other answer; the endpoint is there.
	verdictAnswered
)

// recordBreaker updates ep's breaker after an attempt with verdict v.
func (d *Deliverer) recordBreaker(ctx context.Context, ep *endpoint, v breakerVerdict, log *logrus.Entry) {
	if ep.Breaker == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var err error
	switch v {
	case verdictFailed:
		var wasOpen, probing, open bool
		var failures int
		err = d.pool.QueryRow(ctx, d.sql.breakerFail, ep.Name, ep.Breaker.Failures, ep.Breaker.CoolDown.Microseconds()).
			Scan(&wasOpen, &probing, &open, &failures)
		if err == nil && open && (!wasOpen || probing) {
			breakerOpen.WithLabelValues(ep.Name).Set(1)
			breakerTransitions.WithLabelValues(ep.Name, "open").Inc()
			log.WithField("failures", failures).WithField("cool_down", ep.Breaker.CoolDown.String()).
				Warn("circuit breaker open: the endpoint keeps failing; its events wait until a probe succeeds")
		}
	case verdictAnswered:
		var wasOpen bool
		err = d.pool.QueryRow(ctx, d.sql.breakerClose, ep.Name).Scan(&wasOpen)
		if errors.Is(err, pgx.ErrNoRows) {
			err = nil // closed already: nothing written
		} else if err == nil && wasOpen {
			breakerOpen.WithLabelValues(ep.Name).Set(0)
			breakerTransitions.WithLabelValues(ep.Name, "closed").Inc()
			log.Info("circuit breaker closed: the endpoint answers again")
		}
	default:
		_, err = d.pool.Exec(ctx, d.sql.breakerRelease, ep.Name)
	}
	if err != nil {
		// The state is advisory: at worst one more attempt or one more probe goes out.
		log.WithError(err).Warn("error recording the circuit breaker's state")
	}
}

// claimIn runs the claim statement in tx.
func (d *Deliverer) claimIn(ctx context.Context, tx pgx.Tx, ep *endpoint, limit int) ([]*row, error) {
	token := uuid.New()
	lease := ep.Timeout + d.cfg.LeaseMargin
	rows, err := tx.Query(ctx, d.sql.claim, ep.Name, limit, token, lease.Microseconds())
	if err != nil {
		return nil, fmt.Errorf("error claiming deliveries: %w", err)
	}
	return collectClaimed(rows, token, lease)
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func gateStatements(e string) (gate, gateUpdate, breakerFail, breakerClose, breakerRelease string) {
	gate = `SELECT breaker_open_until, breaker_probe_until, rate_tokens, rate_at, now() FROM ` + e + ` WHERE name = $1 FOR UPDATE`
	gateUpdate = `UPDATE ` + e + ` SET rate_tokens = $2, rate_at = $3,
    breaker_probe_until = coalesce($4, breaker_probe_until) WHERE name = $1`
	// A failure opens the breaker after the threshold, and again at once when it was the
	// probe (or came while one was out); the open state's end moves with each failure.
	breakerFail = `UPDATE ` + e + ` e SET breaker_failures = e.breaker_failures + 1,
    breaker_open_until = CASE WHEN e.breaker_probe_until IS NOT NULL OR e.breaker_failures + 1 >= $2
        THEN now() + $3::bigint * interval '1 microsecond' ELSE e.breaker_open_until END,
    breaker_probe_until = NULL
FROM (SELECT breaker_open_until IS NOT NULL AS was_open, breaker_probe_until IS NOT NULL AS probing FROM ` + e + ` WHERE name = $1) old
WHERE e.name = $1
RETURNING old.was_open, old.probing, e.breaker_open_until IS NOT NULL, e.breaker_failures`
	// Nothing is written while the breaker is closed and counts no failure: the common case.
	breakerClose = `UPDATE ` + e + ` e SET breaker_failures = 0, breaker_open_until = NULL, breaker_probe_until = NULL
FROM (SELECT breaker_open_until IS NOT NULL AS was_open FROM ` + e + ` WHERE name = $1) old
WHERE e.name = $1 AND (e.breaker_failures <> 0 OR e.breaker_open_until IS NOT NULL OR e.breaker_probe_until IS NOT NULL)
RETURNING old.was_open`
	breakerRelease = `UPDATE ` + e + ` SET breaker_probe_until = NULL WHERE name = $1 AND breaker_probe_until IS NOT NULL`
	return
}

package receiver

import (
	"net"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/idemd/idemd/internal/metrics"
)

// unverifiedBudget bounds the bytes of request bodies read while their signature or token is
// not yet checked, across every request of a Receiver. Without it memory grew with
// connections × BodyLimit for anyone who can open connections, no secret needed.
type unverifiedBudget struct {
	max  int64
	used atomic.Int64
}

// admit reserves room for req's body before it is read: its Content-Length, or the
// source's BodyLimit when the body is chunked. When the budget cannot hold it the request is
// answered 503 with Retry-After at once, nothing read, and ok is false. release gives the
// room back; it may be called more than once.
func (r *Receiver) admit(w http.ResponseWriter, req *http.Request, src *source) (release func(), ok bool) {
	n := src.bodyLimit
	if req.ContentLength >= 0 && req.ContentLength < n {
		n = req.ContentLength
	}
	b := &r.unverified
	n = min(n, b.max) // a body larger than the whole budget takes all of it, no more
	if b.used.Add(n) > b.max {
		b.used.Add(-n)
		metrics.Rejected.WithLabelValues(src.name, "busy").Inc()
		writeProblem(w, probUnavailable, "too many unverified request bodies are being read; retry later", "", 1)
		return nil, false
	}
	var once sync.Once
	return func() { once.Do(func() { b.used.Add(-n) }) }, true
}

// connLimit closes connections beyond max as soon as they are accepted (http.Server's
// ConnState hook), before anything is read from them.
type connLimit struct {
	max  int64
	open atomic.Int64
}

func (l *connLimit) track(c net.Conn, s http.ConnState) {
	switch s {
	case http.StateNew:
		if l.open.Add(1) > l.max {
			metrics.Rejected.WithLabelValues("unknown", "too_many_connections").Inc()
			// Closed before the server reads a byte; the server then reports StateClosed,
			// which gives the slot back.
			_ = c.Close()
		}
	case http.StateHijacked, http.StateClosed:
		l.open.Add(-1)
	}
}

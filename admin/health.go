package admin

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idemd/idemd/internal/metrics"
	"github.com/idemd/idemd/migrations"
)

func metricsHandler() http.HandlerFunc {
	return promhttp.HandlerFor(metrics.Registry, promhttp.HandlerOpts{Registry: metrics.Registry}).ServeHTTP
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if reason := s.notReady(r.Context()); reason != "" {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not_ready", "reason": reason})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

// readiness caches the database's part of /readyz (ping and migration status) for ttl: a
// probe storm costs one round of checks per ttl, and concurrent probes share it.
type readiness struct {
	ttl    time.Duration
	mu     sync.Mutex
	at     time.Time
	reason string
}

// notReady returns why the process should not receive traffic, or "". Draining answers at
// once, uncached.
func (s *Server) notReady(ctx context.Context) string {
	if s.draining.Load() {
		return "shutting down"
	}
	if reason := s.ready.database(ctx, s); reason != "" {
		return reason
	}
	if !s.started.Load() {
		return "starting"
	}
	return ""
}

func (rd *readiness) database(ctx context.Context, s *Server) string {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	if !rd.at.IsZero() && time.Since(rd.at) < rd.ttl {
		return rd.reason
	}
	rd.reason, rd.at = s.checkDatabase(ctx), time.Now()
	return rd.reason
}

func (s *Server) checkDatabase(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := s.pool.Ping(ctx); err != nil {
		if st := s.pool.Stat(); st.AcquiredConns() >= st.MaxConns() {
			// The server may answer, but every connection is taken by work that waits: on
			// a lock (a migration's), or on a slow server.
			return fmt.Sprintf("no database connection free within 2 s: all %d in use", st.MaxConns())
		}
		return "database does not answer"
	}
	st, err := migrations.CurrentStatus(ctx, s.pool, &migrations.Config{Schema: s.cfg.Schema})
	if err != nil {
		return "cannot read the migration status"
	}
	if !st.UpToDate() {
		return "migrations not applied"
	}
	return ""
}

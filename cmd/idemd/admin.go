package main

import (
	"context"
	"encoding/json"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idemd/idemd/internal/metrics"
	"github.com/idemd/idemd/migrations"
)

// admin serves /metrics, /healthz and /readyz. It starts before the migrations so that a
// probe can tell "alive but not ready" from "dead".
type admin struct {
	pool   *pgxpool.Pool
	schema string
	// started is set once every role runs; draining once shutdown began (a draining
	// process answers not ready so that load balancers stop sending it requests).
	started, draining atomic.Bool
}

func (a *admin) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(metrics.Registry, promhttp.HandlerOpts{Registry: metrics.Registry}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", a.ready)
	return mux
}

func (a *admin) ready(w http.ResponseWriter, r *http.Request) {
	if reason := a.notReady(r.Context()); reason != "" {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not_ready", "reason": reason})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

// notReady returns why the process should not receive traffic, or "".
func (a *admin) notReady(ctx context.Context) string {
	if a.draining.Load() {
		return "shutting down"
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := a.pool.Ping(ctx); err != nil {
		return "database does not answer"
	}
	st, err := migrations.CurrentStatus(ctx, a.pool, &migrations.Config{Schema: a.schema})
	if err != nil {
		return "cannot read the migration status"
	}
	if !st.UpToDate() {
		return "migrations not applied"
	}
	if !a.started.Load() {
		return "starting"
	}
	return ""
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

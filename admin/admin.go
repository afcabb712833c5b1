// Package admin is idemd's admin server: liveness, readiness and Prometheus metrics, open to
// probes and scrapers; and, behind the admin token, the JSON admin API under /api/v1, its
// OpenAPI documents, the operator console and pprof.
//
// Guarantees: nothing but /healthz, /readyz, /metrics and the console's sign-in form and
// assets answers without a valid token (IDEMD_ADMIN_TOKEN, compared as fixed-length
// digests), not even a 404 or 405 to an unknown path or method, unless the operator opened the reads
// (Config.InsecureReads), and writes never are; a write made with the browser's session
// cookie must carry the session's CSRF token. Every write is logged and audited (who, when,
// what, result) in the admin_audit table. A dead letter is replayed at most once, however
// many single or bulk replays run at the same time: a second replay of it is refused
// (409 for a single replay, "skipped" in a bulk one).
package admin

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"net/http/pprof"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sirupsen/logrus"

	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/delivery"
	"github.com/idemd/idemd/migrations"
	"github.com/idemd/idemd/outbox"
	"github.com/idemd/idemd/processed"
	"github.com/idemd/idemd/receiver"
)

// Defaults of Config and of the HTTP server.
const (
	ReadyCacheDefault   = time.Second
	ReadHeaderTimeout   = 5 * time.Second
	ReadTimeout         = 30 * time.Second
	WriteTimeout        = 60 * time.Second
	IdleTimeout         = 120 * time.Second
	MaxHeaderBytes      = 64 << 10
	bulkWriteTimeout    = 30 * time.Minute
	profileWriteTimeout = 5 * time.Minute
)

// Replayer replays one dead letter through the door that wrote it, exactly once, and says
// what it did (its outcome, and in a few words how): it returns an error wrapping deadletter.ErrAlreadyReplayed for
// a letter replayed before, and deadletter.ErrNotFound for an unknown one. Any other error
// means nothing was committed. *deadletter.Replayer, with the doors registered, is one.
type Replayer interface {
	Replay(ctx context.Context, id int64) (deadletter.Replayed, error)
}

// ConsumerStatus reports the inbound subscriptions (groups, partitions, lag, last batch).
type ConsumerStatus interface {
	Consumers(ctx context.Context) ([]Consumer, error)
}

// Config configures a Server.
type Config struct {
	// Schema holds idemd's tables. Defaults to "idemd".
	Schema string
	// Tokens are the admin tokens (ParseTokens). Without any, the API, the console and pprof
	// answer 401 to everyone, unless InsecureReads opens the reads. Defaults to none.
	Tokens []Token
	// InsecureReads lets requests without a token read (never write). Defaults to false.
	InsecureReads bool
	// Replayer replays dead letters. Defaults to none: replays answer 503.
	Replayer Replayer
	// Consumers reports the subscriptions. Defaults to none: an empty list.
	Consumers ConsumerStatus
	// Sources are the receiver's sources, for the receiver's OpenAPI document. Defaults to
	// none.
	Sources []receiver.Source
	// OutboxKeepsPublished says that the relay keeps published outbox rows
	// (outbox.RelayConfig.KeepPublished). Without it the outbox holds only the rows still
	// to publish, and the console and Story say so. Defaults to false, as the relay's.
	OutboxKeepsPublished bool
	// ReadyCache is how long a /readyz answer is reused, so that probes cost the database
	// at most one round of checks per period. Defaults to 1 s.
	ReadyCache time.Duration
	// Logger receives the server's logs (one line per write). Defaults to logrus's standard
	// logger.
	Logger *logrus.Entry
}

// Server is the admin server. It is an http.Handler.
type Server struct {
	pool      *pgxpool.Pool
	cfg       Config
	log       *logrus.Entry
	mux       *http.ServeMux
	routes    []route
	auth      *authenticator
	processed *processed.Store
	letters   *deadletter.Store
	outbox    *outbox.Store
	delivery  *delivery.Store
	audit     *Audit
	ready     readiness
	console   *console

	started, draining atomic.Bool
}

// New returns a Server on pool.
func New(pool *pgxpool.Pool, cfg *Config) (*Server, error) {
	if pool == nil {
		return nil, errors.New("admin: pool is required")
	}
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	c.Schema = cmp.Or(c.Schema, migrations.SchemaDefault)
	c.ReadyCache = cmp.Or(c.ReadyCache, ReadyCacheDefault)
	if c.Logger == nil {
		c.Logger = logrus.NewEntry(logrus.StandardLogger())
	}
	ps, err := processed.New(&processed.Config{Schema: c.Schema})
	if err != nil {
		return nil, err
	}
	s := &Server{
		pool: pool, cfg: c, log: c.Logger.WithField("component", "admin"), mux: http.NewServeMux(),
		auth:      newAuthenticator(c.Tokens, c.InsecureReads),
		processed: ps, letters: deadletter.New(c.Schema), outbox: outbox.New(&outbox.Config{Schema: c.Schema}),
		delivery: delivery.NewStore(c.Schema), audit: NewAudit(c.Schema),
	}
	s.ready.ttl = c.ReadyCache
	if s.console, err = newConsole(s); err != nil {
		return nil, err
	}
	s.register()
	return s, nil
}

// access is what a route needs from the caller.
type access int

const (
	open    access = iota // probes and scrapers
	read                  // a token, or InsecureReads
	write                 // a token (and the CSRF token with the session cookie)
	private               // a token, even with InsecureReads: pprof
)

// route is one registered pattern. Every route but the console's and pprof's is in the
// admin OpenAPI document (a test holds them equal).
type route struct {
	method, path string
	access       access
}

func (s *Server) handle(method, path string, a access, h http.HandlerFunc) {
	s.routes = append(s.routes, route{method: method, path: path, access: a})
	s.mux.Handle(method+" "+path, s.guard(a, path, h))
}

func (s *Server) register() {
	s.handle("GET", "/healthz", open, s.healthz)
	s.handle("GET", "/readyz", open, s.readyz)
	s.handle("GET", "/metrics", open, metricsHandler())

	s.handle("GET", "/openapi/admin.yaml", read, s.openAPIAdmin)
	s.handle("GET", "/openapi/receiver.yaml", read, s.openAPIReceiver)

	s.handle("GET", "/api/v1/messages", read, s.apiMessages)
	s.handle("GET", "/api/v1/messages/{pipeline}/{id}", read, s.apiMessage)
	s.handle("GET", "/api/v1/conflicts", read, s.apiConflicts)
	s.handle("GET", "/api/v1/dead-letters", read, s.apiDeadLetters)
	s.handle("GET", "/api/v1/dead-letters/{id}", read, s.apiDeadLetter)
	s.handle("POST", "/api/v1/dead-letters/{id}/replay", write, s.apiReplay)
	s.handle("POST", "/api/v1/dead-letters/replay", write, s.apiBulkReplay)
	s.handle("GET", "/api/v1/outbox", read, s.apiOutbox)
	s.handle("GET", "/api/v1/outbox/backlog", read, s.apiBacklog)
	s.handle("GET", "/api/v1/deliveries", read, s.apiDeliveries)
	s.handle("POST", "/api/v1/deliveries/{id}/requeue", write, s.apiRequeue)
	s.handle("GET", "/api/v1/endpoints", read, s.apiEndpoints)
	s.handle("POST", "/api/v1/endpoints/{name}/disable", write, s.apiDisable)
	s.handle("POST", "/api/v1/endpoints/{name}/enable", write, s.apiEnable)
	s.handle("GET", "/api/v1/consumers", read, s.apiConsumers)

	// pprof needs the token always, InsecureReads or not: profiles and goroutine dumps tell
	// an attacker a lot (code paths, the command line), and a CPU profile or trace costs
	// the daemon CPU for as long as the caller asks.
	s.handle("GET", "/debug/pprof/", private, pprof.Index)
	s.handle("GET", "/debug/pprof/cmdline", private, pprof.Cmdline)
	s.handle("GET", "/debug/pprof/profile", private, longWrite(profileWriteTimeout, pprof.Profile))
	s.handle("GET", "/debug/pprof/symbol", private, pprof.Symbol)
	s.handle("GET", "/debug/pprof/trace", private, longWrite(profileWriteTimeout, pprof.Trace))

	s.console.register()
}

// ServeHTTP serves the admin routes. A request that no route takes is authenticated
// first, as a read, unless its path is an open one's: without the token, an unknown path
// or a wrong method answers 401 like any other, so that routes cannot be probed.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h, pattern := s.mux.Handler(r); pattern == "" {
		unrouted := func(w http.ResponseWriter, r *http.Request) { s.unrouted(w, r, h) }
		if s.isOpen(r.URL.Path) {
			unrouted(w, r)
			return
		}
		s.guard(read, r.URL.Path, unrouted).ServeHTTP(w, r)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// isOpen says whether path is an open route's (probes, metrics, the console's sign-in and
// assets), whatever the method.
func (s *Server) isOpen(path string) bool {
	for _, rt := range s.routes {
		if rt.access != open {
			continue
		}
		switch {
		case rt.path == "/{$}":
			if path == "/" {
				return true
			}
		case strings.HasSuffix(rt.path, "/"):
			if strings.HasPrefix(path, rt.path) {
				return true
			}
		case path == rt.path:
			return true
		}
	}
	return false
}

// unrouted answers a request that no route takes, 404, or 405 with Allow, as the mux
// decides (h is its answer), as a problem like the API's other errors (on the console's
// paths, its error page) rather than the mux's plain text.
func (s *Server) unrouted(w http.ResponseWriter, r *http.Request, h http.Handler) {
	rec := &statusRecorder{header: http.Header{}}
	h.ServeHTTP(rec, r)
	if rec.status == http.StatusMethodNotAllowed {
		allow := rec.header.Get("Allow")
		w.Header().Set("Allow", allow)
		s.problem(w, r, http.StatusMethodNotAllowed, "method-not-allowed", "Method not allowed", "use "+allow)
		return
	}
	s.notFound(w, r, "no such path (the routes: /openapi/admin.yaml)")
}

// statusRecorder keeps the status and headers a handler writes, and drops its body.
type statusRecorder struct {
	header http.Header
	status int
}

func (r *statusRecorder) Header() http.Header { return r.header }

func (r *statusRecorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	return len(b), nil
}

// HTTPServer returns an http.Server for s with the admin server's limits: read, write and
// idle timeouts (a bulk replay and a CPU profile extend their own write deadline) and a
// header size bound.
func (s *Server) HTTPServer() *http.Server {
	return &http.Server{
		Handler:           s,
		ReadHeaderTimeout: ReadHeaderTimeout,
		ReadTimeout:       ReadTimeout,
		WriteTimeout:      WriteTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
	}
}

// Started marks the process as serving (every role runs): /readyz may answer ready.
func (s *Server) Started() { s.started.Store(true) }

// Draining marks the process as shutting down: /readyz answers 503 at once, so that load
// balancers stop sending it requests.
func (s *Server) Draining() { s.draining.Store(true) }

// IsDraining reports whether Draining was called.
func (s *Server) IsDraining() bool { return s.draining.Load() }

// longWrite extends the write deadline of a handler that legitimately runs long.
func longWrite(d time.Duration, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(d))
		h(w, r)
	}
}

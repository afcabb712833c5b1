package admin

import (
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/delivery"
	"github.com/idemd/idemd/processed"
)

// The console: server-rendered pages over the same queries as the API, from embedded
// templates and assets (no CDN, works offline). A page shows the ids, states and reasons it
// lists as text; forms work without JavaScript (the little script adds keyboard shortcuts
// and confirmations).
//
//go:embed ui/templates/*.html ui/static/*
var uiFS embed.FS

const flashCookie = "idemd_admin_flash"

type console struct {
	s     *Server
	pages map[string]*template.Template
}

func isConsolePath(path string) bool { return path == "/" || strings.HasPrefix(path, "/ui/") }

var pageNames = []string{"login", "error", "messages", "message", "dead_letters", "dead_letter", "conflicts", "outbox", "deliveries", "consumers"}

func newConsole(s *Server) (*console, error) {
	funcs := template.FuncMap{
		"time": func(t any) string {
			switch v := t.(type) {
			case time.Time:
				return v.UTC().Format(time.RFC3339)
			case *time.Time:
				if v == nil {
					return "—"
				}
				return v.UTC().Format(time.RFC3339)
			}
			return ""
		},
		"ago": func(t time.Time) string { return time.Since(t).Round(time.Second).String() },
		"body": func(b *body) string {
			if b == nil {
				return ""
			}
			return b.Data
		},
		"pathEscape": url.PathEscape,
		"list":       func(v ...string) []string { return v },
		"deref": func(p *int) string {
			if p == nil {
				return "—"
			}
			return strconv.Itoa(*p)
		},
	}
	c := &console{s: s, pages: map[string]*template.Template{}}
	for _, name := range pageNames {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(uiFS, "ui/templates/layout.html", "ui/templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("admin: console template %s: %w", name, err)
		}
		c.pages[name] = t
	}
	return c, nil
}

func (c *console) register() {
	s := c.s
	static, _ := fs.Sub(uiFS, "ui/static")
	files := http.StripPrefix("/ui/static/", http.FileServerFS(static))
	s.handle("GET", "/ui/static/", open, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "max-age=3600")
		files.ServeHTTP(w, r)
	})
	s.handle("GET", "/{$}", open, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/ui/messages", http.StatusSeeOther)
	})
	s.handle("GET", "/ui/login", open, func(w http.ResponseWriter, r *http.Request) { c.login(w, r, http.StatusOK, "") })
	s.handle("POST", "/ui/login", open, c.signIn)
	s.handle("POST", "/ui/logout", open, c.signOut)
	s.handle("GET", "/ui/messages", read, c.messages)
	s.handle("GET", "/ui/messages/{pipeline}/{id}", read, c.message)
	s.handle("GET", "/ui/dead-letters", read, c.deadLetters)
	s.handle("GET", "/ui/dead-letters/{id}", read, c.deadLetter)
	s.handle("POST", "/ui/dead-letters/{id}/replay", write, c.replay)
	s.handle("POST", "/ui/dead-letters/replay", write, c.bulkReplay)
	s.handle("GET", "/ui/conflicts", read, c.conflicts)
	s.handle("GET", "/ui/outbox", read, c.outbox)
	s.handle("GET", "/ui/deliveries", read, c.deliveries)
	s.handle("POST", "/ui/endpoints/{name}/disable", write, func(w http.ResponseWriter, r *http.Request) { c.setEndpoint(w, r, true) })
	s.handle("POST", "/ui/endpoints/{name}/enable", write, func(w http.ResponseWriter, r *http.Request) { c.setEndpoint(w, r, false) })
	s.handle("POST", "/ui/deliveries/{id}/requeue", write, c.requeue)
	s.handle("GET", "/ui/consumers", read, c.consumers)
}

// view is what every page template gets.
type view struct {
	Title   string
	Nav     string
	Actor   string
	CanEdit bool
	CSRF    string
	Flash   string
	Error   string
	Q       url.Values
	Next    string
	Data    any
	// OutboxKept: the relay keeps published outbox rows (Config.OutboxKeepsPublished).
	OutboxKept bool
}

func (c *console) render(w http.ResponseWriter, r *http.Request, status int, name string, v view) {
	caller := callerOf(r)
	v.Actor, v.CanEdit, v.CSRF, v.Q = caller.actor, caller.token != nil, caller.csrfToken(), r.URL.Query()
	v.OutboxKept = c.s.cfg.OutboxKeepsPublished
	if f, err := r.Cookie(flashCookie); err == nil {
		if msg, err := url.QueryUnescape(f.Value); err == nil {
			v.Flash = msg
		}
		http.SetCookie(w, &http.Cookie{Name: flashCookie, Path: "/ui/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Referrer-Policy", "same-origin")
	w.WriteHeader(status)
	if err := c.pages[name].Execute(w, v); err != nil {
		c.s.log.WithError(err).WithField("page", name).Warn("console page failed to render")
	}
}

// redirectWithFlash answers a form's POST: back to the page, with a one-time message.
func (c *console) redirectWithFlash(w http.ResponseWriter, r *http.Request, msg string) {
	http.SetCookie(w, &http.Cookie{Name: flashCookie, Value: url.QueryEscape(msg), Path: "/ui/", MaxAge: 60,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	http.Redirect(w, r, back(r), http.StatusSeeOther)
}

// back is where a form returns: its "back" field when it is a console path, else the
// messages page.
func back(r *http.Request) string {
	b := r.PostFormValue("back")
	if strings.HasPrefix(b, "/ui/") && !strings.HasPrefix(b, "//") && !strings.ContainsAny(b, "\\\r\n") {
		return b
	}
	return "/ui/messages"
}

func (c *console) errorPage(w http.ResponseWriter, r *http.Request, status int, title, detail string) {
	c.render(w, r, status, "error", view{Title: title, Error: detail})
}

func (c *console) login(w http.ResponseWriter, r *http.Request, status int, msg string) {
	next := r.URL.RequestURI()
	switch {
	case r.URL.Path == "/ui/login":
		next = r.URL.Query().Get("next")
	case r.Method != http.MethodGet:
		next = "/ui/messages" // a form's target is not a page to return to
	}
	switch {
	case len(c.s.auth.tokens) == 0 && c.s.auth.insecureReads:
		msg = "IDEMD_ADMIN_TOKEN is not set on this idemd: its pages can be read (IDEMD_ADMIN_INSECURE_READS), but nothing can be changed and nobody can sign in. Set it and restart."
	case len(c.s.auth.tokens) == 0:
		msg = "IDEMD_ADMIN_TOKEN is not set on this idemd: the console is closed. Set it and restart."
	}
	c.render(w, r, status, "login", view{Title: "Sign in", Error: msg, Data: next})
}

// signIn checks the token entered once and sets the session cookie (HttpOnly,
// SameSite=Strict); the token itself is not stored in the browser.
func (c *console) signIn(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 8<<10)
	if len(c.s.auth.tokens) == 0 {
		// No token is wrong: there is none to sign in with.
		c.s.log.WithField("remote", r.RemoteAddr).Warn("console sign-in refused: IDEMD_ADMIN_TOKEN is not set, the console is closed")
		c.login(w, r, http.StatusUnauthorized, "")
		return
	}
	t := c.s.auth.match(strings.TrimSpace(r.PostFormValue("token")))
	if t == nil {
		c.s.log.WithField("remote", r.RemoteAddr).Warn("console sign-in with an invalid token")
		c.login(w, r, http.StatusUnauthorized, "That token is not valid.")
		return
	}
	expires := time.Now().Add(sessionTTL)
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: t.newSession(expires), Path: "/", Expires: expires,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	c.s.log.WithField("actor", t.Name).Info("console sign-in")
	next := r.PostFormValue("next")
	if !strings.HasPrefix(next, "/ui/") || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n") {
		next = "/ui/messages"
	}
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (c *console) signOut(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
}

// listView is the data of a list page.
type listView struct {
	Items any
	Extra any
}

func (c *console) messages(w http.ResponseWriter, r *http.Request) {
	p := newParams(r)
	f := messageFilter(p)
	v := view{Title: "Messages", Nav: "messages"}
	if p.err != nil {
		v.Error = p.err.Error()
		c.render(w, r, http.StatusBadRequest, "messages", v)
		return
	}
	items, next, err := c.s.listMessages(r, f)
	if err != nil {
		c.s.internal(w, r, err)
		return
	}
	v.Data, v.Next = listView{Items: items}, next
	c.render(w, r, http.StatusOK, "messages", v)
}

func (c *console) message(w http.ResponseWriter, r *http.Request) {
	pipeline, id := r.PathValue("pipeline"), r.PathValue("id")
	st, err := c.s.Story(r.Context(), pipeline, id, r.URL.Query().Get("tenant"))
	if errors.Is(err, processed.ErrNotFound) {
		c.s.notFound(w, r, "no record of message "+quote(id)+" in pipeline "+quote(pipeline)+" (never received, or pruned after its retention)")
		return
	}
	if err != nil {
		c.s.internal(w, r, err)
		return
	}
	c.render(w, r, http.StatusOK, "message", view{Title: "Message " + id, Nav: "messages", Data: st})
}

func (c *console) deadLetters(w http.ResponseWriter, r *http.Request) {
	p := newParams(r)
	q := lettersQuery(p)
	v := view{Title: "Dead letters", Nav: "dead-letters", Data: listView{Extra: origins()}}
	if p.err != nil {
		v.Error = p.err.Error()
		c.render(w, r, http.StatusBadRequest, "dead_letters", v)
		return
	}
	items, next, err := c.s.listLetters(r, q)
	if err != nil {
		c.s.internal(w, r, err)
		return
	}
	v.Data, v.Next = listView{Items: items, Extra: origins()}, next
	c.render(w, r, http.StatusOK, "dead_letters", v)
}

func (c *console) deadLetter(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r, "id")
	if err != nil {
		c.s.badRequest(w, r, err)
		return
	}
	l, err := c.s.letter(r.Context(), id)
	if errors.Is(err, deadletter.ErrNotFound) {
		c.s.notFound(w, r, fmt.Sprintf("no dead letter %d (never written, or pruned)", id))
		return
	}
	if err != nil {
		c.s.internal(w, r, err)
		return
	}
	c.render(w, r, http.StatusOK, "dead_letter", view{Title: fmt.Sprintf("Dead letter %d", id), Nav: "dead-letters", Data: l})
}

func (c *console) replay(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r, "id")
	if err != nil {
		c.s.badRequest(w, r, err)
		return
	}
	if c.s.cfg.Replayer == nil {
		c.redirectWithFlash(w, r, errNoReplayer.Error())
		return
	}
	outcome, _, err := c.s.replayOne(r.Context(), actorOf(r), id, uuid.New(), false)
	switch {
	case errors.Is(err, deadletter.ErrAlreadyReplayed):
		c.redirectWithFlash(w, r, fmt.Sprintf("Dead letter %d was replayed before: not run again.", id))
	case err != nil:
		c.redirectWithFlash(w, r, fmt.Sprintf("Dead letter %d: %s: %s", id, outcome, redactURLs(err.Error())))
	default:
		c.redirectWithFlash(w, r, fmt.Sprintf("Dead letter %d replayed.", id))
	}
}

// bulkReplay runs the dead-letter page's bulk form: the filter fields, and dry_run.
func (c *console) bulkReplay(w http.ResponseWriter, r *http.Request) {
	_ = r.ParseForm()
	p := &params{q: r.PostForm}
	req := BulkReplayRequest{LetterFilter: letterFilter(p), DryRun: r.PostFormValue("dry_run") == "true", All: r.PostFormValue("all") == "true"}
	if p.err != nil {
		c.redirectWithFlash(w, r, p.err.Error())
		return
	}
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(bulkWriteTimeout))
	res, err := c.s.BulkReplay(r.Context(), actorOf(r), req, nil)
	if errors.Is(err, ErrBulkUnfiltered) {
		c.redirectWithFlash(w, r, "Nothing replayed: the filter is empty. Filter the letters first, or tick \"every letter not yet replayed\".")
		return
	}
	if err != nil {
		c.redirectWithFlash(w, r, "Bulk replay stopped: "+err.Error())
		return
	}
	msg := fmt.Sprintf("Dry run: %d letters match and would be replayed.", res.Matched)
	if !res.DryRun {
		msg = fmt.Sprintf("Bulk replay: %d matched, %d replayed, %d skipped, %d failed.", res.Matched, res.Replayed, res.Skipped, res.Failed)
		for _, e := range res.Errors {
			msg += fmt.Sprintf(" Letter %d: %s.", e.ID, e.Error)
		}
	}
	if res.More {
		msg += fmt.Sprintf(" More than %d match: run it again for the rest.", BulkLimitMax)
	}
	c.redirectWithFlash(w, r, msg)
}

func (c *console) conflicts(w http.ResponseWriter, r *http.Request) {
	p := newParams(r)
	f := conflictFilter(p)
	v := view{Title: "Conflicts", Nav: "conflicts"}
	if p.err != nil {
		v.Error = p.err.Error()
		c.render(w, r, http.StatusBadRequest, "conflicts", v)
		return
	}
	items, next, err := c.s.listConflicts(r, f)
	if err != nil {
		c.s.internal(w, r, err)
		return
	}
	v.Data, v.Next = listView{Items: items}, next
	c.render(w, r, http.StatusOK, "conflicts", v)
}

func (c *console) outbox(w http.ResponseWriter, r *http.Request) {
	p := newParams(r)
	f := outboxFilter(p)
	v := view{Title: "Outbox", Nav: "outbox"}
	if p.err != nil {
		v.Error = p.err.Error()
		c.render(w, r, http.StatusBadRequest, "outbox", v)
		return
	}
	backlog, err := c.s.backlog(r)
	if err != nil {
		c.s.internal(w, r, err)
		return
	}
	items, next, err := c.s.listOutbox(r, f)
	if err != nil {
		c.s.internal(w, r, err)
		return
	}
	v.Data, v.Next = listView{Items: items, Extra: backlog}, next
	c.render(w, r, http.StatusOK, "outbox", v)
}

func (c *console) deliveries(w http.ResponseWriter, r *http.Request) {
	p := newParams(r)
	f := deliveryFilter(p)
	v := view{Title: "Deliveries", Nav: "deliveries"}
	if p.err != nil {
		v.Error = p.err.Error()
		c.render(w, r, http.StatusBadRequest, "deliveries", v)
		return
	}
	endpoints, err := c.s.endpoints(r)
	if err != nil {
		c.s.internal(w, r, err)
		return
	}
	items, next, err := c.s.listDeliveries(r, f)
	if err != nil {
		c.s.internal(w, r, err)
		return
	}
	v.Data, v.Next = listView{Items: items, Extra: endpoints}, next
	c.render(w, r, http.StatusOK, "deliveries", v)
}

func (c *console) setEndpoint(w http.ResponseWriter, r *http.Request, disable bool) {
	name := r.PathValue("name")
	err := c.s.setEndpoint(r.Context(), actorOf(r), name, disable)
	switch {
	case errors.Is(err, delivery.ErrNotFound):
		c.redirectWithFlash(w, r, fmt.Sprintf("No endpoint %q.", name))
	case err != nil:
		c.s.internal(w, r, err)
	case disable:
		c.redirectWithFlash(w, r, fmt.Sprintf("Endpoint %s disabled: its events stay queued.", name))
	default:
		c.redirectWithFlash(w, r, fmt.Sprintf("Endpoint %s enabled: its queued events are delivered in order.", name))
	}
}

func (c *console) requeue(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r, "id")
	if err != nil {
		c.s.badRequest(w, r, err)
		return
	}
	err = c.s.requeue(r.Context(), actorOf(r), id)
	switch {
	case errors.Is(err, delivery.ErrNotFound):
		c.redirectWithFlash(w, r, fmt.Sprintf("No delivery %d.", id))
	case errors.Is(err, delivery.ErrPending):
		c.redirectWithFlash(w, r, fmt.Sprintf("Delivery %d is still pending: not requeued.", id))
	case err != nil:
		c.s.internal(w, r, err)
	default:
		c.redirectWithFlash(w, r, fmt.Sprintf("Delivery %d requeued with the same operation id.", id))
	}
}

func (c *console) consumers(w http.ResponseWriter, r *http.Request) {
	items, err := c.s.consumers(r.Context())
	if err != nil {
		c.s.internal(w, r, err)
		return
	}
	c.render(w, r, http.StatusOK, "consumers", view{Title: "Consumers", Nav: "consumers", Data: listView{Items: items}})
}

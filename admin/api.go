package admin

import (
	"cmp"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// ProblemTypeBase prefixes the type of every admin problem; the fragment names it (see
// docs/console.md).
const ProblemTypeBase = "https://github.com/idemd/idemd/blob/main/docs/console.md#"

// ListLimitMax bounds the limit parameter of every list.
const ListLimitMax = 1000

type problemBody struct {
	Type      string `json:"type"`
	Title     string `json:"title"`
	Status    int    `json:"status"`
	Detail    string `json:"detail,omitempty"`
	Retryable bool   `json:"retryable"`
}

// problem answers an RFC 9457 problem; a console page asked for by a browser (Accept:
// text/html) gets it as an HTML page.
func (s *Server) problem(w http.ResponseWriter, r *http.Request, status int, name, title, detail string) {
	if isConsolePath(r.URL.Path) && acceptsHTML(r) {
		s.console.errorPage(w, r, status, title, detail)
		return
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(problemBody{
		Type: ProblemTypeBase + name, Title: title, Status: status, Detail: detail,
		Retryable: status == http.StatusServiceUnavailable,
	})
}

// noParams refuses a request with query parameters to a path that takes none, and says
// whether it did.
func (s *Server) noParams(w http.ResponseWriter, r *http.Request) bool {
	if err := newParams(r).done(); err != nil {
		s.badRequest(w, r, err)
		return true
	}
	return false
}

func (s *Server) badRequest(w http.ResponseWriter, r *http.Request, err error) {
	s.problem(w, r, http.StatusBadRequest, "bad-request", "Bad request", err.Error())
}

func (s *Server) notFound(w http.ResponseWriter, r *http.Request, what string) {
	s.problem(w, r, http.StatusNotFound, "not-found", "Not found", what)
}

// internal answers 503 for a failure of ours (the database, most often); the error goes to
// the log, not to the caller.
func (s *Server) internal(w http.ResponseWriter, r *http.Request, err error) {
	s.log.WithError(err).WithField("path", r.URL.Path).Warn("admin request failed")
	s.problem(w, r, http.StatusServiceUnavailable, "unavailable", "Temporarily unavailable", "see the idemd logs")
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// page is the envelope of every list: the items, and the cursor of the next page (absent on
// the last page).
type page struct {
	Data any    `json:"data"`
	Next string `json:"next,omitempty"`
}

// params reads query parameters (or a body's fields), remembering the first bad one and
// the names read: done refuses the others, so that a typo (pipline=) is an error rather
// than a filter silently left out.
type params struct {
	q    url.Values
	err  error
	read map[string]bool
	// what names a value in errors: "parameter" (a query's) or "field" (a body's).
	what string
}

func newParams(r *http.Request) *params { return &params{q: r.URL.Query(), what: "parameter"} }

func (p *params) fail(name, format string, args ...any) {
	if p.err == nil {
		p.err = fmt.Errorf("%s %s: %s", cmp.Or(p.what, "parameter"), name, fmt.Sprintf(format, args...))
	}
}

func (p *params) str(name string) string {
	if p.read == nil {
		p.read = map[string]bool{}
	}
	p.read[name] = true
	return strings.TrimSpace(p.q.Get(name))
}

// done returns the first bad parameter, or names one that nothing read.
func (p *params) done() error {
	if p.err != nil {
		return p.err
	}
	for _, name := range slices.Sorted(maps.Keys(p.q)) {
		if p.read[name] {
			continue
		}
		known := slices.Sorted(maps.Keys(p.read))
		switch {
		case (name == "limit" || name == "after") && !p.read["limit"]:
			p.fail(name, "this list is not paged: it is bounded by the configuration and always whole")
		case len(known) == 0:
			p.fail(name, "unknown; this path takes no query parameters")
		default:
			p.fail(name, "unknown; this path takes %s", strings.Join(known, ", "))
		}
		break
	}
	return p.err
}

// oneOf reads a parameter that must be empty or one of allowed.
func (p *params) oneOf(name string, allowed ...string) string {
	v := p.str(name)
	if v == "" {
		return ""
	}
	for _, a := range allowed {
		if v == a {
			return v
		}
	}
	p.fail(name, "%q is not one of %s", v, strings.Join(allowed, ", "))
	return ""
}

// time reads an RFC 3339 time.
func (p *params) time(name string) time.Time {
	v := p.str(name)
	if v == "" {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		p.fail(name, "%q is not an RFC 3339 time (like 2026-01-02T15:04:05Z)", v)
	}
	return t
}

func (p *params) boolean(name string) *bool {
	v := p.str(name)
	if v == "" {
		return nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		p.fail(name, "%q is not true or false", v)
		return nil
	}
	return &b
}

func (p *params) limit() int {
	v := p.str("limit")
	if v == "" {
		return 50
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > ListLimitMax {
		p.fail("limit", "%q is not a number from 1 to %d", v, ListLimitMax)
	}
	return n
}

// cursor decodes the after parameter into v.
func (p *params) cursor(v any) bool {
	raw := p.str("after")
	if raw == "" {
		return false
	}
	b, err := base64.RawURLEncoding.DecodeString(raw)
	if err == nil {
		err = json.Unmarshal(b, v)
	}
	if err != nil {
		p.fail("after", "not a cursor of this list (pass the next value of the previous page)")
		return false
	}
	return true
}

// idCursor is the cursor of lists paged by id.
type idCursor struct {
	ID int64 `json:"id"`
}

func (p *params) afterID() int64 {
	var c idCursor
	p.cursor(&c)
	return c.ID
}

// encodeCursor returns the opaque next value for v.
func encodeCursor(v any) string {
	b, _ := json.Marshal(v)
	return base64.RawURLEncoding.EncodeToString(b)
}

// nextID is the next cursor of a page of n items paged by id, whose last id is last.
func nextID(more bool, last int64) string {
	if !more {
		return ""
	}
	return encodeCursor(idCursor{ID: last})
}

// page1 trims a list asked for limit+1 items to its page of limit, and says whether there
// was more: a next page exists, so a list's last page has no next, even when it is full.
func page1[T any](items []T, limit int) ([]T, bool) {
	if len(items) > limit {
		return items[:limit], true
	}
	return items, false
}

// body is a payload as JSON: text when it is UTF-8, base64 otherwise.
type body struct {
	Data     string `json:"data"`
	Encoding string `json:"encoding"`
}

func encodeBody(b []byte) *body {
	if b == nil {
		return nil
	}
	if utf8.Valid(b) {
		return &body{Data: string(b), Encoding: "utf-8"}
	}
	return &body{Data: base64.StdEncoding.EncodeToString(b), Encoding: "base64"}
}

// secretHeaders are never shown, whatever a writer stored.
var secretHeaders = map[string]bool{
	"authorization": true, "proxy-authorization": true, "cookie": true, "set-cookie": true,
	"stripe-signature": true, "webhook-signature": true, "svix-signature": true,
	"x-hub-signature": true, "x-hub-signature-256": true, "x-shopify-hmac-sha256": true,
	"x-slack-signature": true, "x-api-key": true, "api-key": true,
}

// Redacted replaces a value that must not be shown.
const Redacted = "[redacted]"

// stripHeaders returns headers with the values of secret ones redacted.
func stripHeaders(h map[string][]string) map[string][]string {
	out := make(map[string][]string, len(h))
	for k, vs := range h {
		lk := strings.ToLower(k)
		if secretHeaders[lk] || strings.Contains(lk, "signature") || strings.Contains(lk, "token") || strings.Contains(lk, "secret") {
			out[k] = []string{Redacted}
			continue
		}
		out[k] = vs
	}
	return out
}

var urlPattern = regexp.MustCompile(`[a-zA-Z][a-zA-Z0-9+.-]*://[^\s"'<>]+`)

// redactURLs replaces every URL in s by its scheme, host and port: paths and queries of
// outbound endpoints may carry capabilities (/services/T/B/<secret>, ?token=).
func redactURLs(s string) string {
	return urlPattern.ReplaceAllStringFunc(s, func(raw string) string {
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" {
			return Redacted
		}
		out := u.Scheme + "://" + u.Host
		if u.Path != "" && u.Path != "/" || u.RawQuery != "" {
			out += "/" + Redacted
		}
		return out
	})
}

// redactMetadata redacts URLs in a letter's metadata strings.
func redactMetadata(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		if s, ok := v.(string); ok {
			v = redactURLs(s)
		}
		out[k] = v
	}
	return out
}

// pathID reads a positive integer path value.
func pathID(r *http.Request, name string) (int64, error) {
	id, err := strconv.ParseInt(r.PathValue(name), 10, 64)
	if err != nil || id <= 0 {
		return 0, fmt.Errorf("%s %q is not a positive integer", name, r.PathValue(name))
	}
	return id, nil
}

// writeLogged logs a write at info, as every write must be.
func (s *Server) writeLogged(actor, action, target, outcome string, err error) {
	e := s.log.WithFields(map[string]any{"actor": actor, "action": action, "target": target, "outcome": outcome})
	if err != nil {
		e = e.WithField("error", err.Error())
	}
	e.Info("admin write")
}

var errNoReplayer = errors.New("this process cannot replay dead letters")

package admin

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// MinTokenLength is the shortest admin token accepted, in bytes.
const MinTokenLength = 16

// ActorDefault is who a write is audited as when the token has no name.
const ActorDefault = "admin"

// Token is one admin token: its name (the actor of the audit) and the SHA-256 digest of its
// secret. The secret itself is not kept.
type Token struct {
	Name   string
	digest [sha256.Size]byte
}

// NewToken returns the token of secret, audited as name.
func NewToken(name, secret string) Token {
	return Token{Name: name, digest: sha256.Sum256([]byte(secret))}
}

// ParseTokens parses IDEMD_ADMIN_TOKEN: one token (audited as "admin"), or name:token pairs
// separated by commas (audited by name). A token contains neither ',' nor ':', and is at
// least MinTokenLength bytes long. The errors never quote a token.
func ParseTokens(s string) ([]Token, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	var out []Token
	names := map[string]bool{}
	secrets := map[[sha256.Size]byte]string{} // digest → the name that has it
	for i, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		name, secret, named := strings.Cut(item, ":")
		if !named {
			name, secret = ActorDefault, item
		}
		switch {
		case named && !validName(name):
			return nil, fmt.Errorf("entry %d: the name before ':' must be letters, digits, '-' or '_'", i+1)
		case len(secret) < MinTokenLength:
			return nil, fmt.Errorf("entry %d: a token must be at least %d bytes long (for example: openssl rand -hex 32)", i+1, MinTokenLength)
		case names[name]:
			return nil, fmt.Errorf("entry %d: name %q is used twice", i+1, name)
		}
		t := NewToken(name, secret)
		// One token under two names would make the audit's actor a guess.
		if other, dup := secrets[t.digest]; dup {
			return nil, fmt.Errorf("entry %d: %q has the same token as %q; give each name its own token", i+1, name, other)
		}
		names[name], secrets[t.digest] = true, name
		out = append(out, t)
	}
	return out, nil
}

func validName(name string) bool {
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return name != ""
}

const (
	sessionCookie = "idemd_admin_session"
	sessionTTL    = 12 * time.Hour
	csrfField     = "csrf"
	csrfHeader    = "X-CSRF-Token"
)

// authenticator decides who a request is.
type authenticator struct {
	tokens        []Token
	insecureReads bool
}

func newAuthenticator(tokens []Token, insecureReads bool) *authenticator {
	return &authenticator{tokens: tokens, insecureReads: insecureReads}
}

// caller is who made a request.
type caller struct {
	// actor is the token's name; "" for an anonymous reader (InsecureReads).
	actor string
	// session is the cookie's value when the request was authenticated by it (writes then
	// need the CSRF token).
	session string
	token   *Token
}

var (
	errNoCredentials = errors.New("no credentials")
	errBadCredential = errors.New("invalid credentials")
)

// identify authenticates r by its bearer header, else its session cookie.
func (a *authenticator) identify(r *http.Request, now time.Time) (*caller, error) {
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, secret, ok := strings.Cut(h, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") {
			return nil, errBadCredential
		}
		t := a.match(strings.TrimSpace(secret))
		if t == nil {
			return nil, errBadCredential
		}
		return &caller{actor: t.Name, token: t}, nil
	}
	if c, err := r.Cookie(sessionCookie); err == nil {
		t := a.checkSession(c.Value, now)
		if t == nil {
			return nil, errBadCredential
		}
		return &caller{actor: t.Name, session: c.Value, token: t}, nil
	}
	return nil, errNoCredentials
}

// match returns the token whose secret is secret. Every token is compared, as digests of
// the same length, so that neither the length nor the position of a match shows in time.
func (a *authenticator) match(secret string) *Token {
	d := sha256.Sum256([]byte(secret))
	var found *Token
	for i := range a.tokens {
		if subtle.ConstantTimeCompare(d[:], a.tokens[i].digest[:]) == 1 {
			found = &a.tokens[i]
		}
	}
	return found
}

// mac signs msg with the token's digest (the server's secret for sessions and CSRF tokens).
func (t *Token) mac(msg string) string {
	m := hmac.New(sha256.New, t.digest[:])
	m.Write([]byte(msg))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// newSession returns the cookie value of a session of t until expires:
// name.expiry.signature.
func (t *Token) newSession(expires time.Time) string {
	name := t.Name
	exp := strconv.FormatInt(expires.Unix(), 10)
	return name + "." + exp + "." + t.mac("session|"+name+"|"+exp)
}

// checkSession returns the token of a valid, unexpired session value.
func (a *authenticator) checkSession(v string, now time.Time) *Token {
	parts := strings.Split(v, ".")
	if len(parts) != 3 {
		return nil
	}
	exp, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil || now.Unix() >= exp {
		return nil
	}
	name := parts[0]
	for i := range a.tokens {
		t := &a.tokens[i]
		if t.Name == name && hmac.Equal([]byte(t.mac("session|"+parts[0]+"|"+parts[1])), []byte(parts[2])) {
			return t
		}
	}
	return nil
}

// csrfToken is the CSRF token of a session: forms carry it in a hidden field, scripts in
// the X-CSRF-Token header.
func (c *caller) csrfToken() string {
	if c == nil || c.token == nil || c.session == "" {
		return ""
	}
	return c.token.mac("csrf|" + c.session)
}

// checkCSRF accepts a write made with the session cookie only with the session's CSRF token.
func (c *caller) checkCSRF(r *http.Request) bool {
	if c.session == "" {
		return true // a bearer header is never sent by a browser on its own
	}
	got := r.Header.Get(csrfHeader)
	if got == "" {
		got = r.PostFormValue(csrfField)
	}
	return got != "" && hmac.Equal([]byte(got), []byte(c.csrfToken()))
}

type callerKey struct{}

func withCaller(ctx context.Context, c *caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// callerOf returns the request's caller (never nil behind guard).
func callerOf(r *http.Request) *caller {
	if c, ok := r.Context().Value(callerKey{}).(*caller); ok {
		return c
	}
	return &caller{}
}

// actorOf is who a write is audited as.
func actorOf(r *http.Request) string {
	if a := callerOf(r).actor; a != "" {
		return a
	}
	return "anonymous"
}

// guard applies a route's access rule and puts the caller in the request's context.
func (s *Server) guard(a access, path string, h http.HandlerFunc) http.Handler {
	ui := isConsolePath(path)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		if a == open {
			h(w, r)
			return
		}
		c, err := s.auth.identify(r, time.Now())
		switch {
		case err == nil:
		case errors.Is(err, errNoCredentials) && a == read && s.auth.insecureReads:
			c = &caller{}
		default:
			s.unauthorized(w, r, ui, err)
			return
		}
		if a == write {
			if c.token == nil {
				s.unauthorized(w, r, ui, errNoCredentials)
				return
			}
			if !c.checkCSRF(r) {
				s.problem(w, r, http.StatusForbidden, "csrf", "Missing or invalid CSRF token",
					"writes made with the console's session cookie carry the page's CSRF token")
				return
			}
		}
		h(w, r.WithContext(withCaller(r.Context(), c)))
	})
}

// unauthorized answers a request without valid credentials: a console page asked for by a
// browser gets the sign-in form (status 401); everything else, a console path fetched by a
// script included, the 401 problem+json of SPEC 2.7b.
func (s *Server) unauthorized(w http.ResponseWriter, r *http.Request, ui bool, err error) {
	if ui && acceptsHTML(r) {
		s.console.login(w, r, http.StatusUnauthorized, "")
		return
	}
	detail := "send Authorization: Bearer <IDEMD_ADMIN_TOKEN>"
	switch {
	case len(s.auth.tokens) == 0 && s.auth.insecureReads:
		// Reads pass without a token here: this is a write or pprof.
		detail = "IDEMD_ADMIN_TOKEN is not set: IDEMD_ADMIN_INSECURE_READS opens the reads only; writes (and pprof) need the token"
	case len(s.auth.tokens) == 0:
		detail = "IDEMD_ADMIN_TOKEN is not set: the admin API is closed"
	case errors.Is(err, errBadCredential):
		detail = "the token is not valid"
	case s.auth.insecureReads:
		detail = "writes (and pprof) need Authorization: Bearer <IDEMD_ADMIN_TOKEN>; IDEMD_ADMIN_INSECURE_READS opens the reads only"
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="idemd-admin"`)
	s.problem(w, r, http.StatusUnauthorized, "unauthorized", "Authentication required", detail)
}

// acceptsHTML says whether the request's Accept header names text/html, as a browser's
// navigations and form posts do (curl and HTTP clients send */* or nothing).
func acceptsHTML(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		for part := range strings.SplitSeq(v, ",") {
			media, _, _ := strings.Cut(part, ";")
			if strings.EqualFold(strings.TrimSpace(media), "text/html") {
				return true
			}
		}
	}
	return false
}

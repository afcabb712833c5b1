// Package problemconn makes the answers that Go's HTTP server writes by itself, for requests
// it cannot parse, RFC 9457 problem details like every other error of idemd's servers.
//
// net/http answers a request line or headers that are not valid HTTP/1.1 (400), headers
// over the server's MaxHeaderBytes (431), an unknown Transfer-Encoding (501) and an
// unsupported protocol version (505) before any handler runs, with a text/plain body, and
// http.Server has no hook for them (Go 1.26). It writes each of those answers to the
// connection in one Write, in a fixed form that a handler's answer cannot take: the status
// line, then exactly "Content-Type: text/plain; charset=utf-8" and "Connection: close" in
// that order and nothing else (a handler's headers are written sorted, Connection before
// Content-Type, with a Date). A connection from Listener rewrites that one Write as a
// problem+json answer with the same status; every other byte goes through untouched.
//
// Only plain connections can be wrapped: http.Server recognises TLS by the connection's
// type (*tls.Conn), so a TLS listener keeps Go's text answers.
package problemconn

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"strings"
)

// Listener wraps ln so that net/http's own answers to requests it cannot parse are
// problem+json. typeBase prefixes each problem's type (the fragments are
// "malformed-request", "headers-too-large", "unsupported-transfer-encoding" and
// "http-version-not-supported").
func Listener(ln net.Listener, typeBase string) net.Listener {
	return &listener{Listener: ln, base: typeBase}
}

type listener struct {
	net.Listener
	base string
}

func (l *listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &conn{Conn: c, base: l.base}, nil
}

type conn struct {
	net.Conn
	base string
}

func (c *conn) Write(p []byte) (int, error) {
	if out, ok := rewrite(p, c.base); ok {
		if _, err := c.Conn.Write(out); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	return c.Conn.Write(p)
}

// CloseWrite half-closes the connection, as net/http does after a 431 so that the client
// reads the answer before the connection closes; without it, net/http would skip that step
// for a wrapped connection.
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// goHeaders follows the status line of every answer net/http writes by itself.
const goHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

type kind struct{ name, title string }

var kinds = map[int]kind{
	http.StatusBadRequest:                  {"malformed-request", "Request is not valid HTTP/1.1"},
	http.StatusRequestHeaderFieldsTooLarge: {"headers-too-large", "Request line and headers too large"},
	http.StatusNotImplemented:              {"unsupported-transfer-encoding", "Transfer-Encoding not supported"},
	http.StatusHTTPVersionNotSupported:     {"http-version-not-supported", "HTTP version not supported"},
}

// rewrite returns p as a problem+json answer when p is one of net/http's own answers to a
// request it could not parse, and false otherwise.
func rewrite(p []byte, typeBase string) ([]byte, bool) {
	const proto = "HTTP/1.1 "
	if len(p) < len(proto)+3 || string(p[:len(proto)]) != proto {
		return nil, false
	}
	end := bytes.IndexByte(p, '\r')
	if end < 0 || !bytes.HasPrefix(p[end:], []byte(goHeaders)) {
		return nil, false
	}
	status, err := strconv.Atoi(string(p[len(proto) : len(proto)+3]))
	if err != nil || status < 400 || status > 599 {
		return nil, false
	}
	k, ok := kinds[status]
	if !ok {
		k = kind{"malformed-request", http.StatusText(status)}
	}
	// The detail is net/http's reason, when it gives one: "400 Bad Request: invalid header
	// name" (status line and body alike), or the body alone ("Unsupported transfer encoding").
	var detail string
	line, body := string(p[len(proto):end]), string(p[end+len(goHeaders):])
	if _, reason, ok := strings.Cut(line, ": "); ok {
		detail = reason
	} else if body != line {
		detail = body
	}
	problem, _ := json.Marshal(struct {
		Type      string `json:"type"`
		Title     string `json:"title"`
		Status    int    `json:"status"`
		Detail    string `json:"detail,omitempty"`
		Retryable bool   `json:"retryable"`
	}{typeBase + k.name, k.title, status, detail, false})
	out := make([]byte, 0, 160+len(problem))
	out = append(out, p[:end]...)
	out = append(out, "\r\nContent-Type: application/problem+json\r\nContent-Length: "...)
	out = strconv.AppendInt(out, int64(len(problem)), 10)
	out = append(out, "\r\nConnection: close\r\n\r\n"...)
	return append(out, problem...), true
}

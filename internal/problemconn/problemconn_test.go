package problemconn_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/problemconn"
)

const base = "https://example.test/problems#"

// serve runs an http.Server with a 4 KiB header limit on a wrapped listener; its handler
// answers text/plain itself, with Connection: close, the closest a handler comes to
// net/http's own answers, which must go through untouched.
func serve(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{
		MaxHeaderBytes:    4 << 10,
		ReadHeaderTimeout: 5 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/plain" {
				w.Header().Set("Connection", "close")
				w.Header().Set("Content-Type", "text/plain; charset=utf-8")
				w.WriteHeader(http.StatusBadRequest)
				_, _ = io.WriteString(w, "400 Bad Request")
				return
			}
			_, _ = io.WriteString(w, "ok "+r.URL.Path)
		}),
	}
	go func() { _ = srv.Serve(problemconn.Listener(ln, base)) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// send writes raw on a new connection and reads one answer.
func send(t *testing.T, addr, raw string) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = io.WriteString(c, raw)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(body)
}

func TestGoAnswersBecomeProblems(t *testing.T) {
	addr := serve(t)
	for _, c := range []struct {
		name, raw    string
		status       int
		kind, detail string
	}{
		{"control byte in a header value", "POST /x HTTP/1.1\r\nHost: x\r\nX-A: a\x01b\r\nContent-Length: 0\r\n\r\n", 400, "malformed-request", ""},
		{"bad header name", "GET /x HTTP/1.1\r\nHost: x\r\nBad Name: v\r\n\r\n", 400, "malformed-request", "invalid header name"},
		{"no Host", "GET /x HTTP/1.1\r\n\r\n", 400, "malformed-request", "missing required Host header"},
		{"garbage request line", "HELLO\r\n\r\n", 400, "malformed-request", ""},
		{"two Content-Length values", "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}", 400, "malformed-request", ""},
		{"headers over the limit", "GET /x HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("h", 8<<10) + "\r\n\r\n", 431, "headers-too-large", ""},
		{"unknown transfer encoding", "POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501, "unsupported-transfer-encoding", "Unsupported transfer encoding"},
		{"HTTP/2.0 request line", "GET /x HTTP/2.0\r\nHost: x\r\n\r\n", 505, "http-version-not-supported", "unsupported protocol version"},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp, body := send(t, addr, c.raw)
			require.Equal(t, c.status, resp.StatusCode, body)
			require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
			require.True(t, resp.Close, "the connection closes, as net/http closes it")
			var p struct {
				Type      string `json:"type"`
				Title     string `json:"title"`
				Status    int    `json:"status"`
				Detail    string `json:"detail"`
				Retryable *bool  `json:"retryable"`
			}
			require.NoError(t, json.Unmarshal([]byte(body), &p), body)
			require.Equal(t, base+c.kind, p.Type)
			require.NotEmpty(t, p.Title)
			require.Equal(t, c.status, p.Status)
			if c.detail != "" {
				require.Equal(t, c.detail, p.Detail)
			}
			require.NotNil(t, p.Retryable)
			require.False(t, *p.Retryable)
		})
	}
}

// TestHandlerAnswersGoThrough: what handlers write, keep-alive included, is not touched,
// even a text/plain 400 with Connection: close.
func TestHandlerAnswersGoThrough(t *testing.T) {
	addr := serve(t)
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	r := bufio.NewReader(c)
	for _, path := range []string{"/a", "/b"} {
		_, err = io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n")
		require.NoError(t, err)
		resp, err := http.ReadResponse(r, nil)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, "ok "+path, string(body))
	}
	resp, body := send(t, addr, "GET /plain HTTP/1.1\r\nHost: x\r\n\r\n")
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	require.Equal(t, "text/plain; charset=utf-8", resp.Header.Get("Content-Type"))
	require.Equal(t, "400 Bad Request", body)
}

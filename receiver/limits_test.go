package receiver

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
)

// ghSigned is a GitHub-signed POST of body to base, as raw HTTP/1.1 that asks for
// "100 Continue" before sending its body, and the body itself.
func ghSigned(path, id string, body []byte) (head, rest []byte) {
	sig := "sha256=" + fmt.Sprintf("%x", hmacSHA256([]byte(ghSecret), body))
	head = fmt.Appendf(nil, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nExpect: 100-continue\r\n"+
		"X-Hub-Signature-256: %s\r\nX-GitHub-Delivery: %s\r\n\r\n", path, len(body), sig, id)
	return head, body
}

// TestUnverifiedBodiesBounded: bodies not yet verified share MaxUnverifiedBytes. While one
// request holds 1 MiB of a 1.5 MiB budget (the server asked for its body: "100 Continue"
// is sent when the handler starts reading), another 1 MiB body is answered 503 with
// Retry-After before it is read, a small one still goes through, and once the first is
// verified the room is back.
func TestUnverifiedBodiesBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, 4, func(db *pgtest.DB) Config {
		return Config{MaxUnverifiedBytes: 3 << 19, Sources: []Source{{Name: "gh", Verify: Verify{Scheme: SchemeGitHub, Secrets: []string{ghSecret}}}}}
	})
	big := append(append([]byte(`{"pad":"`), bytes.Repeat([]byte("a"), 1<<20-10)...), '"', '}')
	require.Len(t, big, 1<<20)

	conn, err := net.Dial("tcp", b.srv.Listener.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(30*time.Second)))
	head, rest := ghSigned("/webhooks/gh", "d-held", big)
	_, err = conn.Write(head)
	require.NoError(t, err)
	br := bufio.NewReader(conn)
	line, err := br.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "HTTP/1.1 100 Continue\r\n", line, "the first request was admitted and its body asked for")
	_, _ = br.ReadString('\n') // the empty line after 100 Continue

	post := func(id string, body []byte) resp {
		sig := "sha256=" + fmt.Sprintf("%x", hmacSHA256([]byte(ghSecret), body))
		return do(t, nil, http.MethodPost, b.srv.URL+"/webhooks/gh", body, http.Header{"X-Hub-Signature-256": {sig}, "X-Github-Delivery": {id}})
	}
	refused := post("d-refused", big)
	require.Equal(t, http.StatusServiceUnavailable, refused.status, "%s", refused.body)
	require.Equal(t, "1", refused.header.Get("Retry-After"))
	require.Equal(t, "unavailable", refused.problemType(t))
	require.Equal(t, http.StatusOK, post("d-small", []byte(`{"small":true}`)).status, "a small body fits in what is left")

	_, err = conn.Write(rest)
	require.NoError(t, err)
	res, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, res.Body)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Equal(t, http.StatusOK, post("d-refused", big).status, "verified, the first gave its room back")
}

// TestConnectionsBounded: beyond MaxConns, a connection is closed as soon as it is accepted,
// while the open ones are served; when one closes, its slot is free again.
func TestConnectionsBounded(t *testing.T) {
	t.Parallel()
	srv := httptest.NewUnstartedServer(nil)
	s := NewServer("", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}), &ServerConfig{MaxConns: 2})
	srv.Config = s
	closed := make(chan struct{}, 10)
	track := s.ConnState
	s.ConnState = func(c net.Conn, st http.ConnState) {
		track(c, st)
		if st == http.StateClosed {
			closed <- struct{}{}
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	addr := srv.Listener.Addr().String()
	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		require.NoError(t, c.SetDeadline(time.Now().Add(30*time.Second)))
		t.Cleanup(func() { c.Close() })
		return c, bufio.NewReader(c)
	}
	get := func(c net.Conn, br *bufio.Reader) error {
		if _, err := c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
			return err
		}
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, res.Body)
		return nil
	}
	c1, r1 := dial()
	require.NoError(t, get(c1, r1))
	c2, r2 := dial()
	require.NoError(t, get(c2, r2))
	c3, r3 := dial()
	err := get(c3, r3)
	require.Error(t, err, "the third connection is closed unread")
	require.NotContains(t, err.Error(), "timeout", "closed at once")
	<-closed
	require.NoError(t, get(c1, r1), "the open ones are still served")

	require.NoError(t, c2.Close())
	<-closed
	c4, r4 := dial()
	require.NoError(t, get(c4, r4), "a closed connection's slot is free again")
}

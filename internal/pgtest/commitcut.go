package pgtest

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/internal/pgarray"
)

// CommitCut is a TCP proxy in front of the test database that, once armed, cuts the next
// connection that sends COMMIT: either after forwarding it (the server commits, the client
// never hears back) or instead of forwarding it (the server rolls back). Tests of a COMMIT
// whose outcome is unknown run their pool through it.
type CommitCut struct {
	ln      net.Listener
	target  string
	mu      sync.Mutex
	armed   bool
	forward bool
	cut     chan struct{}
}

// NewCommitCut starts a proxy to the test database, closed at cleanup.
func NewCommitCut(tb testing.TB) *CommitCut {
	tb.Helper()
	u, err := url.Parse(URL())
	if err != nil {
		tb.Fatalf("pgtest: parsing TEST_DATABASE_URL: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("pgtest: listening: %v", err)
	}
	c := &CommitCut{ln: ln, target: u.Host}
	tb.Cleanup(func() { _ = ln.Close() })
	go c.accept()
	return c
}

// Pool returns a pool whose connections go through the proxy, closed at cleanup.
func (c *CommitCut) Pool(tb testing.TB, maxConns int32) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(URL())
	if err != nil {
		tb.Fatalf("pgtest: parsing TEST_DATABASE_URL: %v", err)
	}
	addr := c.ln.Addr().(*net.TCPAddr)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = addr.IP.String(), uint16(addr.Port)
	cfg.ConnConfig.TLSConfig = nil
	cfg.MaxConns = maxConns
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg.AfterConnect = pgarray.AfterConnect
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		tb.Fatalf("pgtest: connecting through the proxy: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// Arm makes the proxy cut the next connection that sends COMMIT, after forwarding it when
// forward is set, instead of forwarding it otherwise. The channel is closed once it did.
func (c *CommitCut) Arm(forward bool) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armed, c.forward, c.cut = true, forward, make(chan struct{})
	return c.cut
}

func (c *CommitCut) accept() {
	for {
		client, err := c.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", c.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		go func() { _, _ = io.Copy(client, server); _ = client.Close() }()
		go c.pipe(client, server)
	}
}

// commitStream finds COMMIT in what a client sends: a simple query "commit" (how pgx's
// Tx.Commit sends it), or a COMMIT in the extended protocol (a pipelined batch ending with
// it, exactlyonce's sendCommit): its Parse names a statement, and every Bind of that
// statement runs it. It reads the stream message by message across chunks.
type commitStream struct {
	buf     []byte
	started bool            // the startup message (no type byte) went by
	commits map[string]bool // prepared statements whose text is COMMIT
}

// feed reads chunk and reports whether it holds a COMMIT.
func (s *commitStream) feed(chunk []byte) bool {
	s.buf = append(s.buf, chunk...)
	found := false
	for {
		if !s.started {
			if len(s.buf) < 4 {
				return found
			}
			n := int(binary.BigEndian.Uint32(s.buf))
			if len(s.buf) < n {
				return found
			}
			code := binary.BigEndian.Uint32(s.buf[4:8])
			s.buf = s.buf[n:]
			// An SSLRequest or GSSENCRequest is followed by another startup message.
			s.started = code != 80877103 && code != 80877104
			continue
		}
		if len(s.buf) < 5 {
			return found
		}
		n := int(binary.BigEndian.Uint32(s.buf[1:5]))
		if len(s.buf) < 1+n {
			return found
		}
		typ, body := s.buf[0], s.buf[5:1+n]
		switch typ {
		case 'Q':
			found = found || isCommit(cstring(body))
		case 'P':
			name := cstring(body)
			if isCommit(cstring(body[len(name)+1:])) {
				if s.commits == nil {
					s.commits = map[string]bool{}
				}
				s.commits[name] = true
			}
		case 'B':
			portal := cstring(body)
			found = found || s.commits[cstring(body[len(portal)+1:])]
		}
		s.buf = s.buf[1+n:]
	}
}

// cstring is the NUL-terminated string at the start of b.
func cstring(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return string(b[:i])
	}
	return string(b)
}

func isCommit(sql string) bool {
	return strings.EqualFold(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(sql), ";")), "commit")
}

func (c *CommitCut) pipe(client, server net.Conn) {
	defer func() { _ = server.Close(); _ = client.Close() }()
	buf := make([]byte, 64<<10)
	var stream commitStream
	for {
		n, err := client.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			if done, forward := c.take(stream.feed(chunk)); done != nil {
				if forward {
					_, _ = server.Write(chunk)
				}
				close(done)
				return
			}
			if _, werr := server.Write(chunk); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// take returns the armed cut's channel when the chunk holds the COMMIT to cut, and
// disarms.
func (c *CommitCut) take(commit bool) (chan struct{}, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.armed || !commit {
		return nil, false
	}
	c.armed = false
	return c.cut, c.forward
}

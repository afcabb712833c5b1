package pgtest

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
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

// commitMsg is how pgx sends COMMIT: a simple query "commit".
var commitMsg = []byte("commit\x00")

func (c *CommitCut) pipe(client, server net.Conn) {
	defer func() { _ = server.Close(); _ = client.Close() }()
	buf := make([]byte, 64<<10)
	for {
		n, err := client.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			if done, forward := c.take(chunk); done != nil {
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

// take returns the armed cut's channel when chunk is the COMMIT to cut, and disarms.
func (c *CommitCut) take(chunk []byte) (chan struct{}, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.armed || !bytes.Contains(chunk, commitMsg) {
		return nil, false
	}
	c.armed = false
	return c.cut, c.forward
}

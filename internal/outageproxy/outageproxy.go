// Package outageproxy is the tests' network outage: a TCP proxy in front of a server
// (PostgreSQL, Pub/Sub, SQS) that forwards connections until it is taken down, then closes
// every connection it carries and refuses new ones (accepts and closes them) until it is up
// again. That is what a client sees of the server's outage, without touching a server other
// tests share.
package outageproxy

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy is a running outage proxy.
type Proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	down   bool
	conns  map[net.Conn]bool
}

// New listens on a free local port and forwards to target (host:port) until the test ends.
func New(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("outageproxy: %v", err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	tb.Cleanup(func() { _ = ln.Close(); p.SetDown(true) })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.pipe(c)
		}
	}()
	return p
}

// Addr is the proxy's address, to give the client instead of the server's.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// pipe carries one connection. It dials under the lock, so that a connection cannot slip
// through while SetDown closes the others.
func (p *Proxy) pipe(c net.Conn) {
	p.mu.Lock()
	if p.down {
		p.mu.Unlock()
		_ = c.Close()
		return
	}
	up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		p.mu.Unlock()
		_ = c.Close()
		return
	}
	p.conns[c], p.conns[up] = true, true
	p.mu.Unlock()
	go func() { _, _ = io.Copy(up, c); _ = up.Close(); _ = c.Close() }()
	_, _ = io.Copy(c, up)
	_ = c.Close()
	_ = up.Close()
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

// SetDown starts (true) or ends (false) the outage.
func (p *Proxy) SetDown(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = down
	if down {
		for c := range p.conns {
			_ = c.Close()
		}
		p.conns = map[net.Conn]bool{}
	}
}

package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// webhookConn is one connection of the webhook load generator: each request is written
// whole and its response read on the caller's goroutine, over one keep-alive TCP connection,
// dialled again when the server closes it. net/http's client hands every request between
// three goroutines (the caller, the connection's writer and its reader) and builds a header
// map for it: CPU that the load generator spends on the cores the receivers share, the same
// per request for both, and so a larger part of the cheaper receiver's. Real senders sign
// and send from their own machines.
type webhookConn struct {
	host, path string
	conn       net.Conn
	br         *bufio.Reader
	req        []byte
}

func newWebhookConn(rawURL string) (*webhookConn, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "http" || u.Host == "" {
		return nil, fmt.Errorf("webhook load: %q is not an http:// URL", rawURL)
	}
	return &webhookConn{host: u.Host, path: u.RequestURI()}, nil
}

// post sends body with its Stripe-Signature header sig and returns the response's status
// and body.
func (c *webhookConn) post(ctx context.Context, body, sig []byte) (int, []byte, error) {
	if c.conn == nil {
		d := net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
		conn, err := d.DialContext(ctx, "tcp", c.host)
		if err != nil {
			return 0, nil, err
		}
		c.conn, c.br = conn, bufio.NewReaderSize(conn, 4096)
	}
	b := append(c.req[:0], "POST "...)
	b = append(b, c.path...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, c.host...)
	b = append(b, "\r\nContent-Type: application/json\r\nStripe-Signature: "...)
	b = append(b, sig...)
	b = append(b, "\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(len(body)), 10)
	b = append(b, "\r\n\r\n"...)
	b = append(b, body...)
	c.req = b
	status, got, err := c.roundTrip(b)
	if err != nil {
		c.close()
	}
	return status, got, err
}

func (c *webhookConn) roundTrip(req []byte) (int, []byte, error) {
	if err := c.conn.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		return 0, nil, err
	}
	if _, err := c.conn.Write(req); err != nil {
		return 0, nil, err
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return 0, nil, err
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil && resp.Close {
		c.close() // answered, then closed by the server: dialled again for the next
	}
	return resp.StatusCode, got, err
}

func (c *webhookConn) close() {
	if c.conn != nil {
		_ = c.conn.Close()
		c.conn, c.br = nil, nil
	}
}

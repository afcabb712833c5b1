package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// TestWebhookConnKeepsAliveAndRedials: requests share one connection until the server
// closes it, and the next request dials again; a chunked answer is read whole.
func TestWebhookConnKeepsAliveAndRedials(t *testing.T) {
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Method != http.MethodPost || r.Header.Get("Stripe-Signature") != "t=1,v1=ab" || r.URL.Path != "/webhooks/stripe" {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		switch string(body) {
		case "close":
			w.Header().Set("Connection", "close")
		case "chunked":
			w.(http.Flusher).Flush() // no Content-Length: chunked
		}
		_, _ = io.WriteString(w, `{"status":"processed","body":"`+string(body)+`"}`)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()

	c, err := newWebhookConn(srv.URL + "/webhooks/stripe")
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	for i, body := range []string{"a", "chunked", "close", "b"} {
		status, got, err := c.post(context.Background(), []byte(body), []byte("t=1,v1=ab"))
		if err != nil || status != http.StatusOK || !strings.Contains(string(got), `"body":"`+body+`"`) {
			t.Fatalf("request %d (%s): %d %s %v", i, body, status, got, err)
		}
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2: one until the server closed it, one after", n)
	}
	if _, err := newWebhookConn("https://example.com/x"); err == nil {
		t.Fatal("an https URL was accepted")
	}
}

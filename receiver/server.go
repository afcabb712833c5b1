package receiver

import (
	"cmp"
	"net/http"
	"time"
)

// Defaults of ServerConfig. Providers time out within seconds (Shopify after 5 s), so a
// request that takes longer than the write timeout is lost anyway; the sender retries it.
const (
	ReadHeaderTimeoutDefault = 5 * time.Second
	ReadTimeoutDefault       = 15 * time.Second
	WriteTimeoutDefault      = 30 * time.Second
	IdleTimeoutDefault       = 120 * time.Second
	MaxHeaderBytesDefault    = 64 << 10
	MaxConnsDefault          = 1024
)

// ServerConfig bounds what one client may cost the HTTP server.
type ServerConfig struct {
	// ReadHeaderTimeout bounds reading the request headers (slowloris). Defaults to 5 s.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading the whole request, body included. Defaults to 15 s.
	ReadTimeout time.Duration
	// WriteTimeout bounds the time from the end of the headers to the end of the response.
	// It must exceed ApplyTimeout plus the longest Prefer: wait. Defaults to 30 s.
	WriteTimeout time.Duration
	// IdleTimeout bounds keep-alive connections between requests. Defaults to 120 s.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds the request line and headers. Defaults to 64 KiB.
	MaxHeaderBytes int
	// MaxConns bounds the open connections, idle keep-alive ones included: a connection
	// accepted beyond it is closed at once, before anything is read (senders retry).
	// Defaults to 1024.
	MaxConns int
}

// NewServer returns an *http.Server on addr serving h with cfg's limits (cfg may be nil).
// Its ConnState hook enforces MaxConns: wrap it, do not replace it.
func NewServer(addr string, h http.Handler, cfg *ServerConfig) *http.Server {
	c := ServerConfig{}
	if cfg != nil {
		c = *cfg
	}
	conns := &connLimit{max: int64(cmp.Or(c.MaxConns, MaxConnsDefault))}
	return &http.Server{
		ConnState:         conns.track,
		Addr:              addr,
		Handler:           h,
		ReadHeaderTimeout: cmp.Or(c.ReadHeaderTimeout, ReadHeaderTimeoutDefault),
		ReadTimeout:       cmp.Or(c.ReadTimeout, ReadTimeoutDefault),
		WriteTimeout:      cmp.Or(c.WriteTimeout, WriteTimeoutDefault),
		IdleTimeout:       cmp.Or(c.IdleTimeout, IdleTimeoutDefault),
		MaxHeaderBytes:    cmp.Or(c.MaxHeaderBytes, MaxHeaderBytesDefault),
	}
}

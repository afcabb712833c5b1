package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"

	"github.com/idemd/idemd/internal/problemconn"
	"github.com/idemd/idemd/receiver"
)

// receiverTLS loads the receiver's certificate when one is configured: nil without one
// (plain HTTP, for a TLS-terminating proxy in front), an error naming the variables when
// only one of the two files is given or they do not load. Loading at New, not at the first
// handshake, makes a bad certificate a configuration error (exit 2) instead of a daemon
// that is ready but fails every connection.
func receiverTLS(c *daemonConfig) (*tls.Config, error) {
	switch {
	case c.TLSCertFile == "" && c.TLSKeyFile == "":
		return nil, nil
	case c.TLSCertFile == "" || c.TLSKeyFile == "":
		return nil, errors.New("IDEMD_TLS_CERT_FILE and IDEMD_TLS_KEY_FILE must be set together")
	}
	cert, err := tls.LoadX509KeyPair(c.TLSCertFile, c.TLSKeyFile)
	if err != nil {
		// The error names the files, never their content.
		return nil, fmt.Errorf("IDEMD_TLS_CERT_FILE/IDEMD_TLS_KEY_FILE: %w", err)
	}
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
		NextProtos:   []string{"h2", "http/1.1"},
	}, nil
}

// listenReceiver wraps the receiver's listener in TLS when a certificate is configured;
// without one, in problemconn's, so that the requests net/http refuses by itself are
// answered problem+json too (http.Server tells TLS by the connection's type, so a TLS
// listener cannot be wrapped: it keeps net/http's text answers).
func (d *daemon) listenReceiver(ln net.Listener) net.Listener {
	if d.tls == nil {
		return problemconn.Listener(ln, receiver.ProblemTypeBase)
	}
	return tls.NewListener(ln, d.tls)
}

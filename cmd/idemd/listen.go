package main

import (
	"cmp"
	"errors"
	"fmt"
	"net"
)

// The listen addresses' defaults when the daemon's configuration leaves them empty (the
// environment's are the envDefault tags of Env).
const (
	httpAddrDefault  = ":8080"
	adminAddrDefault = "127.0.0.1:9090"
)

// listen opens the TCP listener of the address held by variable name; its error names the
// variable, as serve and check report it.
func listen(name, addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("error listening on %s %s: %w", name, addr, err)
	}
	return ln, nil
}

// checkListen is what check says of the addresses serve would listen on: it listens on
// those serve would open (the admin server's always, the receiver's when its role runs
// with sources) and closes them at once, so that a port another process holds is
// reported; the others are only parsed and resolved. All problems are returned together.
func (c *daemonConfig) checkListen() error {
	cfg := *c
	if len(cfg.Roles) == 0 {
		cfg.Roles = rolesDefault // as newDaemon: the roles did not parse, or were not given
	}
	receiverRuns := cfg.has(roleReceiver) && cfg.Pipelines != nil && len(cfg.Pipelines.Sources) > 0
	var errs []error
	for _, a := range []struct {
		name, addr string
		used       bool
	}{
		{"IDEMD_HTTP_ADDR", cmp.Or(c.HTTPAddr, httpAddrDefault), receiverRuns},
		{"IDEMD_ADMIN_ADDR", cmp.Or(c.AdminAddr, adminAddrDefault), true},
	} {
		if !a.used {
			if _, err := net.ResolveTCPAddr("tcp", a.addr); err != nil {
				errs = append(errs, fmt.Errorf("%s %s is not a listen address (host:port, such as :8080): %w", a.name, a.addr, err))
			}
			continue
		}
		ln, err := listen(a.name, a.addr)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		_ = ln.Close()
	}
	return errors.Join(errs...)
}

package main

import (
	"fmt"
	"strings"
)

// role is one of the parts a process runs (IDEMD_ROLES). The constants are declared in
// shutdown order: a role stops only after every role before it stopped, so that what the
// earlier ones wrote is still drained by the later ones (the receiver and the consumers
// write outbox rows, the relay publishes them).
type role int

const (
	roleReceiver role = iota
	roleConsumer
	roleRelay
	rolePruner
)

// roleNames are the names IDEMD_ROLES uses, by role.
var roleNames = [...]string{
	roleReceiver: "receiver",
	roleConsumer: "consumer",
	roleRelay:    "relay",
	rolePruner:   "pruner",
}

// rolesDefault are the roles of `idemd serve` unless IDEMD_ROLES says otherwise.
var rolesDefault = []role{roleReceiver, roleConsumer, roleRelay, rolePruner}

func (r role) String() string {
	if r < 0 || int(r) >= len(roleNames) {
		return fmt.Sprintf("role(%d)", int(r))
	}
	return roleNames[r]
}

// parseRoles turns the names of IDEMD_ROLES into roles, skipping blanks, and names every
// unknown one.
func parseRoles(names []string) ([]role, error) {
	var (
		out     []role
		unknown []string
	)
	for _, n := range names {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		found := false
		for r, name := range roleNames {
			if name == n {
				out, found = append(out, role(r)), true
				break
			}
		}
		if !found {
			unknown = append(unknown, fmt.Sprintf("%q", n))
		}
	}
	if len(unknown) > 0 {
		return nil, fmt.Errorf("IDEMD_ROLES: unknown role %s (known: %s)", strings.Join(unknown, ", "), strings.Join(roleNames[:], ", "))
	}
	return out, nil
}

// joinRoles is the IDEMD_ROLES spelling of rs.
func joinRoles(rs []role) string {
	names := make([]string, len(rs))
	for i, r := range rs {
		names[i] = r.String()
	}
	return strings.Join(names, ",")
}

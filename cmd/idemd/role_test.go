package main

import (
	"context"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/idemd/idemd/admin"
	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"
)

func TestParseRoles(t *testing.T) {
	t.Parallel()
	rs, err := parseRoles([]string{" relay", "", "receiver "})
	require.NoError(t, err)
	require.Equal(t, []role{roleRelay, roleReceiver}, rs)
	require.Equal(t, "relay,receiver", joinRoles(rs))

	_, err = parseRoles([]string{"receiver", "janitor", "cook"})
	require.EqualError(t, err, `IDEMD_ROLES: unknown role "janitor", "cook" (known: receiver, consumer, relay, pruner)`)
}

// TestShutdownOrderFollowsRoles: the parts stop role by role in the order of the role
// constants, whatever order they were started in; the parts of one role stop together (each
// consumer waits here until its sibling stops too, which would deadlock one by one).
func TestShutdownOrderFollowsRoles(t *testing.T) {
	t.Parallel()
	quiet := logrus.New()
	quiet.SetOutput(io.Discard)
	d := &daemon{cfg: daemonConfig{ShutdownTimeout: 10 * time.Second}, admin: &admin.Server{}, log: logrus.NewEntry(quiet)}

	var (
		mu      sync.Mutex
		stopped []role
		both    sync.WaitGroup
	)
	both.Add(2)
	mk := func(r role, name string) *part {
		return &part{role: r, name: name, stop: func(ctx context.Context) error {
			if r == roleConsumer {
				both.Done()
				both.Wait()
			}
			mu.Lock()
			defer mu.Unlock()
			stopped = append(stopped, r)
			return nil
		}}
	}
	parts := []*part{
		mk(rolePruner, "the pruner"), mk(roleRelay, "the HTTP deliverer"), mk(roleConsumer, "subscription a"),
		mk(roleRelay, "the relay"), mk(roleReceiver, "the receiver"), mk(roleConsumer, "subscription b"),
	}
	require.NoError(t, d.shutdown(parts))
	require.Equal(t, []role{roleReceiver, roleConsumer, roleConsumer, roleRelay, roleRelay, rolePruner}, stopped)
	require.True(t, d.admin.IsDraining(), "not ready once the drain began")
}

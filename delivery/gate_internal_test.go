package delivery

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestAdmit(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *time.Time { v := now.Add(d); return &v }
	f := func(v float64) *float64 { return &v }

	plain := &endpoint{Endpoint: Endpoint{Breaker: &Breaker{Failures: 3, CoolDown: time.Minute}}}
	require.Equal(t, admission{n: 4}, plain.admit(gateState{now: now}, 4), "closed: everything free")
	require.Equal(t, admission{wait: 10 * time.Second}, plain.admit(gateState{now: now, openUntil: at(10 * time.Second)}, 4), "open: nothing")
	require.Equal(t, admission{n: 1, probe: true}, plain.admit(gateState{now: now, openUntil: at(-time.Second)}, 4), "cooled down: one probe")
	require.Equal(t, admission{wait: 5 * time.Second}, plain.admit(gateState{now: now, openUntil: at(-time.Second), probeUntil: at(5 * time.Second)}, 4),
		"a probe is out: nothing more")
	require.Equal(t, admission{n: 1, probe: true}, plain.admit(gateState{now: now, openUntil: at(-time.Minute), probeUntil: at(-time.Second)}, 4),
		"the probe's lease ended (its deliverer died): probe again")

	rated := &endpoint{Endpoint: Endpoint{Rate: 2}}
	require.Equal(t, admission{n: 2, tokens: 2}, rated.admit(gateState{now: now}, 4), "a full bucket holds Rate tokens")
	require.Equal(t, admission{n: 1, tokens: 1.5}, rated.admit(gateState{now: now, tokens: f(0.5), at: at(-500 * time.Millisecond)}, 4), "refilled at Rate per second")
	require.Equal(t, admission{tokens: 0.5, wait: 250 * time.Millisecond}, rated.admit(gateState{now: now, tokens: f(0), at: at(-250 * time.Millisecond)}, 4))
	require.Equal(t, admission{n: 2, tokens: 2}, rated.admit(gateState{now: now, tokens: f(0), at: at(-time.Hour)}, 4), "never more than the capacity")

	slow := &endpoint{Endpoint: Endpoint{Rate: 0.5}}
	require.Equal(t, admission{n: 1, tokens: 1}, slow.admit(gateState{now: now}, 4), "a bucket holds one token at least")
	require.Equal(t, admission{tokens: 0, wait: 2 * time.Second}, slow.admit(gateState{now: now, tokens: f(0), at: at(0)}, 4))

	both := &endpoint{Endpoint: Endpoint{Rate: 1, Breaker: &Breaker{Failures: 1, CoolDown: time.Second}}}
	require.Equal(t, admission{tokens: 0, wait: time.Second}, both.admit(gateState{now: now, openUntil: at(-time.Second), tokens: f(0), at: at(0)}, 4),
		"no probe without a token")
}

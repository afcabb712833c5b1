package receiver

import (
	"io"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/require"
)

// TestOutageLogsOneLineASecond: while the database is down, a source's 503s are logged at
// most once a second, the next line counting the ones left out, so that every failure is
// accounted for in the log without a line per request.
func TestOutageLogsOneLineASecond(t *testing.T) {
	t.Parallel()
	logger, hook := logtest.NewNullLogger()
	logger.SetOutput(io.Discard)
	b, proxy := outageSetup(t, logrus.NewEntry(logger))

	proxy.SetDown(true)
	const failures = 20
	send := func(i int) {
		require.Equal(t, 503, b.stripe(t, stripeEvent("evt_down_"+string(rune('a'+i)), 1, "")).status)
	}
	for i := range failures - 1 {
		send(i)
	}
	time.Sleep(failureLogEvery + 100*time.Millisecond)
	send(failures - 1)
	proxy.SetDown(false)

	lines, counted := 0, 0
	for _, e := range hook.AllEntries() {
		if e.Message != "webhook transaction failed; answered 503, nothing stored" {
			continue
		}
		require.Equal(t, logrus.ErrorLevel, e.Level)
		lines++
		counted++
		if n, ok := e.Data["count"].(int); ok {
			counted += n
		}
	}
	require.Equal(t, failures, counted, "every failure is a line or counted in one")
	require.Less(t, lines, failures/2, "a line per request")
	require.GreaterOrEqual(t, lines, 2, "the failures after a second are logged again")
}

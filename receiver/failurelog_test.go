package receiver

import (
	"io"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
)

// TestOutageLogsOneLineASecond: while the database is down, a source's 503s are logged at
// most once a second, the next line counting the ones left out, so that every failure is
// accounted for in the log without a line per request.
func TestOutageLogsOneLineASecond(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	db.Exec(t, db.Q(`CREATE TABLE {schema}.effects (
		id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, message_id text, tenant text,
		body jsonb, amount bigint CHECK (amount >= 0))`))
	pool, proxy := pgtest.OutagePool(t, 4)
	logger, hook := logtest.NewNullLogger()
	logger.SetOutput(io.Discard)
	r, err := New(pool, &Config{Schema: db.Schema, Logger: logrus.NewEntry(logger), Sources: []Source{stripeSource(db)}})
	require.NoError(t, err)
	t.Cleanup(r.Close)
	b := &bundle{db: db, rcv: r, srv: newServer(t, r)}

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

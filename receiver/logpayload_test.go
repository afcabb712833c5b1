package receiver

import (
	"fmt"
	"io"
	"testing"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
)

// TestPermanentFailuresLogNoPayload: the warning of an effect that failed permanently names
// the SQLSTATE, not PostgreSQL's message, which quotes the value it refused (SPEC 2.7: no
// payloads above debug level); at debug level the line carries the whole error.
func TestPermanentFailuresLogNoPayload(t *testing.T) {
	t.Parallel()
	for _, level := range []logrus.Level{logrus.InfoLevel, logrus.DebugLevel} {
		logger, hook := logtest.NewNullLogger()
		logger.SetOutput(io.Discard)
		logger.SetLevel(level)
		b := setup(t, 4, func(db *pgtest.DB) Config {
			return Config{Logger: logrus.NewEntry(logger), Sources: []Source{stripeSource(db), ordersSource(db)}}
		})
		const value = "card 4242 4242"
		body := []byte(fmt.Sprintf(`{"id":"evt_log_%s","object":"event","type":"x","data":{"object":{"id":"pi_1","amount":%q}}}`, level, value))
		require.Equal(t, 202, b.stripe(t, body).status)
		require.Equal(t, 422, b.order(t, "token-a-0123456789", "k-log", fmt.Sprintf(`{"amount":%q}`, value)).status)

		lines := 0
		for _, e := range hook.AllEntries() {
			if e.Level != logrus.WarnLevel {
				continue
			}
			reason, ok := e.Data["reason"].(string)
			require.True(t, ok, "%s: %v", e.Message, e.Data)
			lines++
			if level == logrus.DebugLevel {
				require.Contains(t, reason, value, "debug level: the whole error")
				continue
			}
			require.Contains(t, reason, "SQLSTATE 22P02", e.Message)
			require.NotContains(t, reason, "4242", e.Message)
		}
		require.Equal(t, 2, lines, "the webhook's dead letter and the API's 422")
	}
}

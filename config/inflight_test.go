package config

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestBatchesInFlight: batches_in_flight loads for any subscription and defaults to the
// consumer's (0 here, filled by consumer.New); 0 or less is refused, naming the file, the
// subscription and the key.
func TestBatchesInFlight(t *testing.T) {
	t.Parallel()
	f, err := Load(write(t, valid), lookup)
	require.NoError(t, err)
	require.Zero(t, f.Subscriptions[0].BatchesInFlight)

	set := func(v string) string {
		return strings.Replace(valid, "    retention: 7d\n", "    retention: 7d\n    batches_in_flight: "+v+"\n", 1)
	}
	f, err = Load(write(t, set("16")), lookup)
	require.NoError(t, err)
	require.Equal(t, 16, f.Subscriptions[0].BatchesInFlight)
	f, err = Load(write(t, strings.Replace(brokers, "    sqs: {queue: payments.fifo}\n", "    sqs: {queue: payments.fifo}\n    batches_in_flight: 2\n", 1)), lookup)
	require.NoError(t, err)
	require.Equal(t, 2, f.Subscriptions[1].BatchesInFlight)

	for _, v := range []string{"0", "-1"} {
		path, err := loadErr(t, set(v))
		require.Error(t, err, v)
		for _, want := range []string{path, `subscriptions[0] "ledger"`, "batches_in_flight:", "must be at least 1"} {
			require.Contains(t, err.Error(), want, v)
		}
	}
}

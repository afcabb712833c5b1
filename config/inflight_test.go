package config

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSubscriptionBatchKeys: batch_size and batches_in_flight load for any subscription and
// default to the consumer's (0 here, filled by consumer.New); a value out of range is
// refused, naming the file, the subscription and the key.
func TestSubscriptionBatchKeys(t *testing.T) {
	t.Parallel()
	for _, k := range []struct {
		key      string
		get      func(f *File, i int) int
		good     string
		bad      map[string]string // value: what the error says
		goodBrok string
	}{
		{"batch_size", func(f *File, i int) int { return f.Subscriptions[i].BatchSize }, "1000",
			map[string]string{"0": "must be at least 1", "-5": "must be at least 1", "10001": "must be at most 10000"}, "100"},
		{"batches_in_flight", func(f *File, i int) int { return f.Subscriptions[i].BatchesInFlight }, "16",
			map[string]string{"0": "must be at least 1", "-1": "must be at least 1"}, "2"},
	} {
		f, err := Load(write(t, valid), lookup)
		require.NoError(t, err)
		require.Zero(t, k.get(f, 0), k.key)

		set := func(v string) string {
			return strings.Replace(valid, "    retention: 7d\n", "    retention: 7d\n    "+k.key+": "+v+"\n", 1)
		}
		f, err = Load(write(t, set(k.good)), lookup)
		require.NoError(t, err, k.key)
		require.Equal(t, k.good, strconv.Itoa(k.get(f, 0)), k.key)
		f, err = Load(write(t, strings.Replace(brokers, "    sqs: {queue: payments.fifo}\n", "    sqs: {queue: payments.fifo}\n    "+k.key+": "+k.goodBrok+"\n", 1)), lookup)
		require.NoError(t, err, k.key)
		require.Equal(t, k.goodBrok, strconv.Itoa(k.get(f, 1)), k.key)

		for v, msg := range k.bad {
			path, err := loadErr(t, set(v))
			require.Error(t, err, k.key+": "+v)
			for _, want := range []string{path, `subscriptions[0] "ledger"`, k.key + ":", msg} {
				require.Contains(t, err.Error(), want, k.key+": "+v)
			}
		}
	}
}

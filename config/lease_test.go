package config

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestBrokerLease: lease and max_lease load for Pub/Sub and SQS subscriptions; SQS wants
// whole seconds, Pub/Sub at least 6 s, max_lease no less than lease, and Kafka none.
func TestBrokerLease(t *testing.T) {
	t.Parallel()
	src := strings.Replace(brokers, "    sqs: {queue: payments.fifo}\n", "    sqs: {queue: payments.fifo}\n    lease: 5s\n    max_lease: 1h\n", 1)
	f, err := Load(write(t, src), lookup)
	require.NoError(t, err)
	require.Equal(t, 5*time.Second, f.Subscriptions[1].Lease)
	require.Equal(t, time.Hour, f.Subscriptions[1].MaxLease)

	for _, tc := range []struct {
		name, src       string
		line            int
		pipeline, field string
		msg             string
	}{
		{"sqs fractions", strings.Replace(src, "lease: 5s", "lease: 1500ms", 1), 8, `subscriptions[1] "aws-payments"`, "lease", "whole seconds"},
		{"pubsub too short", strings.Replace(brokers, "    pubsub: {subscription: orders-idemd, project: shop}\n", "    pubsub: {subscription: orders-idemd, project: shop}\n    lease: 2s\n", 1), 2, `subscriptions[0] "gcp-orders"`, "lease", "at least 6s"},
		{"max below lease", strings.Replace(src, "max_lease: 1h", "max_lease: 2s", 1), 8, `subscriptions[1] "aws-payments"`, "max_lease", "shorter than lease"},
		{"kafka", strings.Replace(valid, "message_id: {header: operation-id}", "message_id: {header: operation-id}\n    lease: 10s", 1), 17, `subscriptions[0] "ledger"`, "lease", "only Pub/Sub and SQS subscriptions lease"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path, err := loadErr(t, tc.src)
			require.Error(t, err)
			require.Contains(t, err.Error(), path)
			require.Contains(t, err.Error(), tc.pipeline)
			require.Contains(t, err.Error(), tc.field+":")
			require.Contains(t, err.Error(), tc.msg)
		})
	}
}

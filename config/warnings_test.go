package config

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A source whose retention is shorter than its sender's retry horizon is a warning with
// its line; the default retention (7 days) covers every known horizon; API sources and
// schemes without a horizon never warn.
func TestRetentionHorizonWarnings(t *testing.T) {
	t.Parallel()
	f, err := Parse("w.yaml", []byte(`sources:
  - name: stripe
    verify: {scheme: stripe, secrets_env: STRIPE_WEBHOOK_SECRET}
    retention: 2d
  - name: svix
    verify: {scheme: standard-webhooks, secrets_env: SVIX_SECRET}
    retention: 27h
  - name: shop
    verify: {scheme: shopify, secrets_env: STRIPE_WEBHOOK_SECRET}
    retention: 4h
  - name: defaults
    verify: {scheme: stripe, secrets_env: STRIPE_WEBHOOK_SECRET}
  - name: gh
    verify: {scheme: github, secrets_env: STRIPE_WEBHOOK_SECRET}
    retention: 1h
  - name: orders
    path: /v1/orders
    verify: {scheme: bearer, tokens_env: ORDERS_TOKENS}
    idempotency: {retention: 1h}
`), func(name string) (string, bool) {
		if name == "SVIX_SECRET" {
			return "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", true
		}
		return lookup(name)
	})
	require.NoError(t, err)
	warnings := f.Warnings()
	require.Len(t, warnings, 2)
	require.EqualError(t, warnings[0], `w.yaml:4: sources[0] "stripe": retention: 2d is shorter than how long stripe retries a webhook (3d): a retry after the retention is applied again; keep it at least 3d`)
	require.Contains(t, warnings[1].Error(), `w.yaml:7: sources[1] "svix": retention: 1d3h is shorter than how long standard-webhooks retries a webhook (1d3h35m)`)
}

// With epochs, mixed retentions warn no more (a record its epoch would outlive is deleted
// row by row); an interval longer than the longest retention is a warning, and so are more
// than eight intervals in the longest retention. Without epochs, or without pipelines,
// nothing.
func TestEpochsWarnings(t *testing.T) {
	t.Parallel()
	f, err := Parse("e.yaml", []byte(`sources:
  - name: stripe
    verify: {scheme: stripe, secrets_env: STRIPE_WEBHOOK_SECRET}
    retention: 30d
  - name: orders
    path: /v1/orders
    verify: {scheme: bearer, tokens_env: ORDERS_TOKENS}
    idempotency: {retention: 24h}
  - name: weekly
    verify: {scheme: stripe, secrets_env: STRIPE_WEBHOOK_SECRET}
    retention: 20d
`), lookup)
	require.NoError(t, err)
	require.Equal(t, 30*24*time.Hour, f.LongestRetention())
	require.Empty(t, f.EpochsWarnings(0))
	// Mixed retentions warn no more: the 24-hour keys are deleted row by row once expired.
	require.Empty(t, f.EpochsWarnings(f.LongestRetention()))
	require.Empty(t, f.EpochsWarnings(f.LongestRetention()/4))
	warnings := f.EpochsWarnings(24 * time.Hour)
	require.Len(t, warnings, 1)
	require.EqualError(t, warnings[0], `IDEMD_PROCESSED_PARTITION_INTERVAL: 24h0m0s keeps about 31 epochs of processed_messages for the longest retention (30d), and a new id is looked for in each older one; the longest retention (30d, the default, auto) keeps two or three`)
	warnings = f.EpochsWarnings(40 * 24 * time.Hour)
	require.Len(t, warnings, 1)
	require.EqualError(t, warnings[0], `IDEMD_PROCESSED_PARTITION_INTERVAL: 960h0m0s is longer than the longest retention (30d), and a record stays until its epoch is dropped, up to one interval past its retention; the longest retention (30d, the default, auto) keeps records at most one retention past it`)
	require.Empty(t, (&File{}).EpochsWarnings(time.Hour), "no pipeline, no retention to compare with")
}

// TestPoolWarnings: the subscriptions' batches in flight (4 each by default) outnumbering
// the pool's connections is a warning; as many or fewer, or no subscriptions, is none.
func TestPoolWarnings(t *testing.T) {
	t.Parallel()
	f, err := Parse("p.yaml", []byte(`subscriptions:
  - name: a
    topics: [a]
  - name: b
    topics: [b]
    batches_in_flight: 12
`), lookup)
	require.NoError(t, err)
	require.Empty(t, f.PoolWarnings(16))
	warnings := f.PoolWarnings(15)
	require.Len(t, warnings, 1)
	require.EqualError(t, warnings[0], `IDEMD_DB_MAX_CONNS: 15 connections, and the subscriptions apply up to 16 batches at once (batches_in_flight, 4 each by default), each holding one while it runs: batches wait for a connection, and the receiver's and the relay's transactions with them; raise IDEMD_DB_MAX_CONNS to more than 16, or lower batches_in_flight`)
	sources, err := Parse("s.yaml", []byte(`sources:
  - name: stripe
    verify: {scheme: stripe, secrets_env: STRIPE_WEBHOOK_SECRET}
`), lookup)
	require.NoError(t, err)
	require.Empty(t, sources.PoolWarnings(2))
}

func TestFormatDuration(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		72 * time.Hour: "3d", 27*time.Hour + 35*time.Minute: "1d3h35m", 4 * time.Hour: "4h",
		90 * time.Second: "1m30s", 30 * time.Second: "30s", 27 * time.Hour: "1d3h", 0: "0s",
	} {
		require.Equal(t, want, formatDuration(d), "%v", d)
	}
}

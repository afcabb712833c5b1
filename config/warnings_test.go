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
	require.Contains(t, warnings[1].Error(), `w.yaml:7: sources[1] "svix": retention: 1d3h0m0s is shorter than how long standard-webhooks retries a webhook (1d3h35m0s)`)
}

// With epochs, a pipeline whose records would stay more than twice its retention (the
// longest retention plus the interval) is a warning with its line; so are more than eight
// intervals in the longest retention. Without epochs, nothing.
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
	require.Empty(t, f.EpochsWarnings(0))
	warnings := f.EpochsWarnings(7 * 24 * time.Hour)
	require.Len(t, warnings, 1)
	require.EqualError(t, warnings[0], `e.yaml:8: sources[1] "orders": idempotency.retention: 1d, but with IDEMD_PROCESSED_PARTITION_INTERVAL=168h0m0s its records stay until their epoch is dropped, up to 37d (the longest retention, 30d, plus the interval): use like retentions, or prune by rows (IDEMD_PROCESSED_PARTITION_INTERVAL=0)`)
	warnings = f.EpochsWarnings(24 * time.Hour)
	require.Len(t, warnings, 2)
	require.EqualError(t, warnings[1], `IDEMD_PROCESSED_PARTITION_INTERVAL: 24h0m0s keeps about 31 epochs of processed_messages for the longest retention (30d), and a new id is looked for in each older one; about the longest retention / 4 (7d12h0m0s) keeps five or six`)
}

package config

import (
	"testing"

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

package receiver

import "time"

// RetryHorizons are how long each scheme's sender keeps retrying a webhook that was not
// acknowledged (SPEC 3.2): a source's dedup records must outlive them, or a late retry is
// applied a second time. Schemes without an entry have no known horizon: GitHub never
// retries by itself (redeliveries are manual), and hmac-sha256 and none are anyone's.
var RetryHorizons = map[string]time.Duration{
	// Stripe retries for up to 3 days in live mode.
	SchemeStripe: 3 * 24 * time.Hour,
	// Svix: at once, then after 5 s, 5 min, 30 min, 2 h, 5 h, 10 h and 10 h: 27 h 35 min.
	SchemeStandardWebhooks: 27*time.Hour + 35*time.Minute,
	// Shopify retries for 4 hours.
	SchemeShopify: 4 * time.Hour,
	// Slack retries 3 times: at once, after 1 minute and after 5 minutes.
	SchemeSlack: 6 * time.Minute,
}

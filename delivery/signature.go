package delivery

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/idemd/idemd/internal/signkey"
)

// Standard Webhooks header names, sent on every attempt.
const (
	HeaderIdempotencyKey   = "Idempotency-Key"
	HeaderWebhookID        = "webhook-id"
	HeaderWebhookTimestamp = "webhook-timestamp"
	HeaderWebhookSignature = "webhook-signature"
)

// ParseSecret decodes a Standard Webhooks secret ("whsec_" followed by base64; the prefix
// is optional) into the HMAC key, which must hold at least 16 bytes (internal/signkey).
func ParseSecret(secret string) ([]byte, error) {
	if secret == "" {
		return nil, errors.New("secret is empty")
	}
	return signkey.DecodeStandard(secret)
}

// Sign returns the webhook-signature value of one request per Standard Webhooks:
// "v1," and the base64 HMAC-SHA256, keyed by key (see ParseSecret), of id.timestamp.body.
func Sign(key []byte, id string, timestamp int64, body []byte) string {
	mac := hmac.New(sha256.New, key)
	fmt.Fprintf(mac, "%s.%d.", id, timestamp)
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// Verify checks a received webhook-signature header (one or more space-separated
// signatures; any v1 may match) in constant time. It is what a Go receiver of idemd's
// deliveries runs; it does not check the timestamp's age, which the caller must bound.
func Verify(key []byte, id, timestamp string, body []byte, header string) bool {
	ts, err := strconv.ParseInt(timestamp, 10, 64)
	if err != nil {
		return false
	}
	want := []byte(Sign(key, id, ts, body))
	for _, sig := range strings.Fields(header) {
		if hmac.Equal([]byte(sig), want) {
			return true
		}
	}
	return false
}

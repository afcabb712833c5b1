// Package signkey holds the one rule every signing key and bearer token of idemd obeys:
// Guarantee: a key accepted here has at least MinBytes bytes once decoded, so that no
// configuration can leave a source verifying, or an endpoint signed, with an empty or
// guessable key (a standard-webhooks secret "whsec_" decodes to no key at all, and an HMAC
// with an empty key is a MAC anyone can compute).
package signkey

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
)

// MinBytes is the shortest key accepted, after decoding: 128 bits.
const MinBytes = 16

// StandardPrefix marks a Standard Webhooks secret; the key is the base64 text after it.
const StandardPrefix = "whsec_"

// Check refuses a key shorter than MinBytes. Its message never contains the key.
func Check(key []byte) error {
	if len(key) < MinBytes {
		return fmt.Errorf("the key is shorter than %d bytes: an empty or short key lets anyone forge requests (generate one with: openssl rand -base64 32)", MinBytes)
	}
	return nil
}

// DecodeStandard decodes a Standard Webhooks secret ("whsec_" followed by base64; the
// prefix is optional) into its HMAC key and checks its length.
func DecodeStandard(secret string) ([]byte, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, StandardPrefix))
	if err != nil {
		// Never echo the secret, not even in part.
		return nil, errors.New(`a standard-webhooks secret is "whsec_" followed by base64`)
	}
	if len(key) < MinBytes {
		// Said in bytes once decoded: the secret's own length, in characters, is longer,
		// and a user counting them would not see why it is refused.
		return nil, fmt.Errorf(`the key is shorter than %d bytes once base64-decoded: a standard-webhooks secret is "whsec_" `+
			`followed by the key in base64, and this one decodes to %d bytes (generate one with: echo whsec_$(openssl rand -base64 32))`,
			MinBytes, len(key))
	}
	return key, nil
}

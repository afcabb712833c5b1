package receiver

import "github.com/idemd/idemd/internal/idemkey"

// Errors of ParseIdempotencyKey.
var (
	ErrNoKey      = idemkey.ErrNoKey
	ErrManyKeys   = idemkey.ErrManyKeys
	ErrInvalidKey = idemkey.ErrInvalidKey
)

// Errors of ParseIdempotencyKey that say more than the sentinel they match with errors.Is.
var (
	// ErrMalformedKey: a key that starts with '"' is read as a Structured Fields string,
	// and this one is not well formed. errors.Is(ErrMalformedKey, ErrInvalidKey) holds.
	ErrMalformedKey = idemkey.ErrMalformedKey
	// ErrCommaKey: a bare key with a comma is an HTTP list of keys; a key that holds a comma
	// is sent as a Structured Fields string ("a,b"). errors.Is(ErrCommaKey, ErrManyKeys)
	// holds.
	ErrCommaKey = idemkey.ErrCommaKey
	// ErrEmptyKey: an empty or blank Idempotency-Key header, refused rather than read as no
	// key (the client meant to send one). errors.Is(ErrEmptyKey, ErrInvalidKey) holds.
	ErrEmptyKey = idemkey.ErrEmptyKey
)

// KeyMaxLen is the longest accepted idempotency key.
const KeyMaxLen = idemkey.MaxLen

// ParseIdempotencyKey returns the one key carried by the Idempotency-Key header values: a
// Structured Fields string ("k") or a bare key (k), which mean the same key. Two header
// lines, a list or an inner list are refused (ErrManyKeys). idemclient writes keys that it
// reads back (internal/idemkey holds both sides).
func ParseIdempotencyKey(values []string) (string, error) { return idemkey.Parse(values) }

// ValidKey reports whether k is 1 to 255 printable ASCII characters (space included).
func ValidKey(k string) bool { return idemkey.Valid(k) }

// Package idemkey reads and writes the Idempotency-Key header (IETF draft): one key of 1 to
// 255 printable ASCII characters, a Structured Fields string ("k") or bare (k), both meaning
// the same key. The receiver parses what clients send with it, and idemclient checks and
// writes the key it sends with it, so the two can never disagree.
package idemkey

import (
	"errors"
	"strings"
)

// Errors of Parse.
var (
	ErrNoKey      = errors.New("no Idempotency-Key header")
	ErrManyKeys   = errors.New("more than one Idempotency-Key")
	ErrInvalidKey = errors.New("Idempotency-Key must be 1 to 255 printable ASCII characters")
)

// Errors of Parse that say more than the sentinel they match with errors.Is.
var (
	// ErrMalformedKey: a key that starts with '"' is read as a Structured Fields string,
	// and this one is not well formed. errors.Is(ErrMalformedKey, ErrInvalidKey) holds.
	ErrMalformedKey error = keyError{ErrInvalidKey, `Idempotency-Key starts with '"' but is not a valid Structured Fields string: ` +
		`it needs its closing '"', \" and \\ are the only escapes, and only ";parameters" may follow it`}
	// ErrCommaKey: a bare key with a comma is an HTTP list of keys; a key that holds a comma
	// is sent as a Structured Fields string ("a,b"). errors.Is(ErrCommaKey, ErrManyKeys)
	// holds.
	ErrCommaKey error = keyError{ErrManyKeys, `more than one Idempotency-Key: a comma separates list members, ` +
		`so a bare key cannot hold one (send it quoted, as a Structured Fields string: "a,b")`}
	// ErrEmptyKey: the header is there, but empty or blank. A client whose key came out empty
	// asked for idempotency and would silently go without it, even where the key is
	// optional. errors.Is(ErrEmptyKey, ErrInvalidKey) holds.
	ErrEmptyKey error = keyError{ErrInvalidKey, `Idempotency-Key is empty: send 1 to 255 printable ASCII characters, ` +
		`or no Idempotency-Key header at all`}
)

// keyError is a refusal with a precise message that still matches its sentinel, is.
type keyError struct {
	is  error
	msg string
}

func (e keyError) Error() string        { return e.msg }
func (e keyError) Is(target error) bool { return target == e.is }

// MaxLen is the longest accepted idempotency key.
const MaxLen = 255

// Parse returns the one key carried by the Idempotency-Key header values.
// The draft standard makes the field a Structured Fields string ("k"); many clients send the
// key bare (k). Both mean the same key. Two header lines, a list ("a", "b") or an inner
// list (("a" "b"), or anything bare that starts with "(") are refused: which one would the
// client expect us to honour? Parameters after a quoted key (";p=1") are ignored, as
// Structured Fields allow.
func Parse(values []string) (string, error) {
	switch len(values) {
	case 0:
		return "", ErrNoKey
	case 1:
	default:
		return "", ErrManyKeys
	}
	v := strings.Trim(values[0], " \t")
	if v == "" {
		return "", ErrEmptyKey
	}
	var key string
	if v[0] == '"' {
		var b strings.Builder
		i := 1
		closed := false
		for i < len(v) {
			c := v[i]
			i++
			if c == '\\' {
				if i >= len(v) || (v[i] != '"' && v[i] != '\\') {
					return "", ErrMalformedKey
				}
				b.WriteByte(v[i])
				i++
				continue
			}
			if c == '"' {
				closed = true
				break
			}
			if c < 0x20 || c > 0x7e {
				return "", ErrInvalidKey
			}
			b.WriteByte(c)
		}
		if !closed {
			return "", ErrMalformedKey
		}
		rest := strings.TrimLeft(v[i:], " \t")
		switch {
		case rest == "", rest[0] == ';':
		case rest[0] == ',':
			return "", ErrManyKeys
		default:
			return "", ErrMalformedKey
		}
		key = b.String()
	} else {
		if strings.Contains(v, ",") {
			return "", ErrCommaKey
		}
		if v[0] == '(' {
			return "", ErrManyKeys
		}
		key = v
	}
	if !Valid(key) {
		return "", ErrInvalidKey
	}
	return key, nil
}

// Valid reports whether k is 1 to 255 printable ASCII characters (space included).
func Valid(k string) bool {
	if len(k) == 0 || len(k) > MaxLen {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x20 || k[i] > 0x7e {
			return false
		}
	}
	return true
}

// Format is the header value that carries the valid key k: k itself when it is an HTTP token
// (letters, digits and !#$%&'*+-.^_`|~, as a UUID is), which every server reads the same;
// else k as a Structured Fields string ("k", with \" and \\ escaped), which Parse reads back
// as k: a bare key with a comma would be a list of keys, and one with spaces at its ends
// would lose them.
func Format(k string) string {
	if isToken(k) {
		return k
	}
	var b strings.Builder
	b.Grow(len(k) + 2)
	b.WriteByte('"')
	for i := 0; i < len(k); i++ {
		if k[i] == '"' || k[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(k[i])
	}
	b.WriteByte('"')
	return b.String()
}

// isToken reports whether k is an HTTP token (RFC 9110, 5.6.2).
func isToken(k string) bool {
	for i := 0; i < len(k); i++ {
		c := k[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return k != ""
}

// Package headerjson writes a map of headers as JSON, byte for byte as encoding/json does,
// without its reflection: a record's headers are encoded once for its effect and once for
// its outbox row, and json.Marshal was a fortieth of the consumer's CPU (BENCHMARKS.md,
// phase 14).
package headerjson

import (
	"encoding/json"
	"slices"
)

// maxKeys is the most keys written on the short path; more go to encoding/json.
const maxKeys = 16

// String is json.Marshal(h) as a string; a nil map is "{}", as the columns store it.
func String(h map[string]string) string {
	if len(h) == 0 {
		return "{}"
	}
	var buf [256]byte // most headers fit: the string is then the one allocation
	if b, ok := appendPlain(buf[:0], h); ok {
		return string(b)
	}
	b, _ := json.Marshal(h) // a map of strings always encodes
	return string(b)
}

// appendPlain appends h's JSON when every key and value is plain (see Plain) and h has at
// most maxKeys keys; ok is false otherwise, with dst unchanged.
func appendPlain(dst []byte, h map[string]string) ([]byte, bool) {
	if len(h) > maxKeys {
		return dst, false
	}
	var stack [maxKeys]string
	keys := stack[:0]
	n := 2 + 4*len(h) // braces, quotes, colons and commas, roughly
	for k, v := range h {
		if !Plain(k) || !Plain(v) {
			return dst, false
		}
		keys = append(keys, k)
		n += len(k) + len(v)
	}
	slices.Sort(keys) // encoding/json sorts a map's keys
	dst = slices.Grow(dst, n)
	dst = append(dst, '{')
	for i, k := range keys {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, '"')
		dst = append(dst, k...)
		dst = append(dst, '"', ':', '"')
		dst = append(dst, h[k]...)
		dst = append(dst, '"')
	}
	return append(dst, '}'), true
}

// Plain says whether encoding/json writes s as it is between quotes: printable ASCII
// without the quote, the backslash, and the <, > and & that it escapes for HTML.
func Plain(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

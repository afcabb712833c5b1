// Package fingerprint computes the payload fingerprints idemd compares when an id is seen
// again. Two payloads that mean the same JSON document (key order, whitespace) have the same
// fingerprint; fields that a provider changes between retries can be left out.
package fingerprint

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"sort"
	"strings"
	"unicode/utf8"
)

// Canonical returns the canonical form of a JSON document: object keys sorted, no
// insignificant whitespace, numbers kept as written. Fields named by ignore (JSON pointers
// such as "/pending_webhooks" or "/data/previous_attributes") are removed. ok is false when
// body is not a single JSON value; then the caller should use the raw bytes.
func Canonical(body []byte, ignore ...string) (out []byte, ok bool) {
	// Invalid UTF-8 would be decoded as U+FFFD: two different bodies, one fingerprint.
	if !utf8.Valid(body) {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, false
	}
	if len(bytes.TrimSpace(body[dec.InputOffset():])) != 0 {
		return nil, false // trailing data: not one JSON value
	}
	for _, p := range ignore {
		remove(v, p)
	}
	var buf bytes.Buffer
	write(&buf, v)
	return buf.Bytes(), true
}

// Body is the fingerprint of a message body: SHA-256 of its canonical JSON, or of its raw
// bytes when it is not JSON.
func Body(body []byte, ignore ...string) []byte {
	if c, ok := Canonical(body, ignore...); ok {
		return Sum([]byte("json"), c)
	}
	return Sum([]byte("raw"), body)
}

// Request is the fingerprint of an API request: method, path and the canonical body.
func Request(method, path string, body []byte) []byte {
	if c, ok := Canonical(body); ok {
		return Sum([]byte(method), []byte(path), []byte("json"), c)
	}
	return Sum([]byte(method), []byte(path), []byte("raw"), body)
}

// Sum hashes parts with their lengths, so that ("ab","c") and ("a","bc") differ.
func Sum(parts ...[]byte) []byte {
	h := sha256.New()
	var n [8]byte
	for _, p := range parts {
		binary.BigEndian.PutUint64(n[:], uint64(len(p)))
		h.Write(n[:])
		h.Write(p)
	}
	return h.Sum(nil)
}

func write(buf *bytes.Buffer, v any) {
	switch x := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		buf.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				buf.WriteByte(',')
			}
			writeString(buf, k)
			buf.WriteByte(':')
			write(buf, x[k])
		}
		buf.WriteByte('}')
	case []any:
		buf.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				buf.WriteByte(',')
			}
			write(buf, e)
		}
		buf.WriteByte(']')
	case string:
		writeString(buf, x)
	case json.Number:
		buf.WriteString(x.String())
	case bool:
		if x {
			buf.WriteString("true")
		} else {
			buf.WriteString("false")
		}
	case nil:
		buf.WriteString("null")
	}
}

func writeString(buf *bytes.Buffer, s string) {
	// Fast path, same bytes as the encoder's: printable ASCII without '"' or '\\' is
	// written as it is, quoted.
	plain := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			plain = false
			break
		}
	}
	if plain {
		buf.Grow(len(s) + 2)
		buf.WriteByte('"')
		buf.WriteString(s)
		buf.WriteByte('"')
		return
	}
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	buf.Truncate(buf.Len() - 1) // Encode's newline
}

// remove deletes the member a JSON pointer names, if there is one.
func remove(v any, pointer string) {
	if pointer == "" || pointer[0] != '/' {
		return
	}
	tokens := strings.Split(pointer[1:], "/")
	for i, t := range tokens {
		tokens[i] = strings.ReplaceAll(strings.ReplaceAll(t, "~1", "/"), "~0", "~")
	}
	for _, t := range tokens[:len(tokens)-1] {
		m, ok := v.(map[string]any)
		if !ok {
			return
		}
		if v, ok = m[t]; !ok {
			return
		}
	}
	if m, ok := v.(map[string]any); ok {
		delete(m, tokens[len(tokens)-1])
	}
}

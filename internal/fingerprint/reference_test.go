package fingerprint

import (
	"bytes"
	"encoding/json"
	"sort"
	"strings"
	"unicode/utf8"
)

// referenceCanonical is the canonical form as it was computed before the streaming
// implementation: decode into Go values with encoding/json, remove the ignored members,
// re-encode with sorted keys. The tests hold Canonical to the same output for every body
// this accepts, except bodies with unpaired surrogate escapes, which it decoded as U+FFFD
// (and Canonical refuses).
func referenceCanonical(body []byte, ignore ...string) ([]byte, bool) {
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
		return nil, false
	}
	for _, p := range ignore {
		referenceRemove(v, p)
	}
	var buf bytes.Buffer
	referenceWrite(&buf, v)
	return buf.Bytes(), true
}

func referenceWrite(buf *bytes.Buffer, v any) {
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
			referenceString(buf, k)
			buf.WriteByte(':')
			referenceWrite(buf, x[k])
		}
		buf.WriteByte('}')
	case []any:
		buf.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				buf.WriteByte(',')
			}
			referenceWrite(buf, e)
		}
		buf.WriteByte(']')
	case string:
		referenceString(buf, x)
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

func referenceString(buf *bytes.Buffer, s string) {
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

func referenceRemove(v any, pointer string) {
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

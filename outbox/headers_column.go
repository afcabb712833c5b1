package outbox

import (
	"bytes"
	"encoding/json"
)

// decodeHeaders decodes the outbox's headers column, a jsonb object of strings, as
// PostgreSQL prints it ({"k": "v", …}). The relay reads it for every row it publishes, and
// encoding/json's decoding into a map was 5 % of a busy consumer's CPU (idemd-bench), so
// the usual case takes a short path: no backslash (no escape to undo), every value a
// string. Anything else goes to encoding/json, whose answer it is in every case
// (FuzzDecodeHeaders).
//
// Most rows carry only a JSON content type: they share jsonOnly, which the relay's readers
// never write to (the publishers read events' headers; a dead letter copies them).
func decodeHeaders(b []byte) (map[string]string, error) {
	if string(b) == jsonOnlyText {
		return jsonOnly, nil
	}
	if m, ok := decodeSimpleHeaders(b); ok {
		return m, nil
	}
	var m map[string]string
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	return m, nil
}

// jsonOnlyText is how PostgreSQL prints the headers of most rows, and jsonOnly what they
// decode to; read only.
const jsonOnlyText = `{"content-type": "application/json"}`

var jsonOnly = map[string]string{HeaderContentType: "application/json"}

// decodeSimpleHeaders is decodeHeaders' short path; ok is false when b is not a plain
// object of strings without escapes (encoding/json decides then).
func decodeSimpleHeaders(b []byte) (m map[string]string, ok bool) {
	if len(b) == 0 || bytes.IndexByte(b, '\\') >= 0 {
		return nil, false
	}
	i := skipJSONSpace(b, 0)
	if i == len(b) || b[i] != '{' {
		return nil, false
	}
	i = skipJSONSpace(b, i+1)
	m = make(map[string]string, bytes.Count(b, []byte{':'}))
	if i < len(b) && b[i] == '}' {
		return m, skipJSONSpace(b, i+1) == len(b)
	}
	for {
		k, j, ok := plainJSONString(b, i)
		if !ok {
			return nil, false
		}
		i = skipJSONSpace(b, j)
		if i == len(b) || b[i] != ':' {
			return nil, false
		}
		v, j, ok := plainJSONString(b, skipJSONSpace(b, i+1))
		if !ok {
			return nil, false
		}
		m[k] = v // a repeated key: the last one wins, as with encoding/json
		i = skipJSONSpace(b, j)
		if i == len(b) {
			return nil, false
		}
		switch b[i] {
		case ',':
			i = skipJSONSpace(b, i+1)
		case '}':
			return m, skipJSONSpace(b, i+1) == len(b)
		default:
			return nil, false
		}
	}
}

// plainJSONString reads the string that starts at b[i] and has no escape; j is just past
// its closing quote. ok is false for anything else, and for control characters and
// invalid UTF-8 (which encoding/json refuses or replaces).
func plainJSONString(b []byte, i int) (s string, j int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return "", 0, false
	}
	end := bytes.IndexByte(b[i+1:], '"')
	if end < 0 {
		return "", 0, false
	}
	raw := b[i+1 : i+1+end]
	for _, c := range raw {
		if c < 0x20 || c >= 0x80 {
			// Control characters are invalid; non-ASCII is left to encoding/json, which
			// replaces invalid UTF-8.
			return "", 0, false
		}
	}
	return internHeader(raw), i + 2 + end, true
}

// internHeader is string(raw), without a copy for the names and values most rows carry.
func internHeader(raw []byte) string {
	switch string(raw) { // no allocation: the compiler compares in place
	case "content-type":
		return "content-type"
	case "application/json":
		return "application/json"
	case HeaderEventType:
		return HeaderEventType
	case "traceparent":
		return "traceparent"
	case "tracestate":
		return "tracestate"
	}
	return string(raw)
}

func skipJSONSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

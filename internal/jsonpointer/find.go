package jsonpointer

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// A door reads two or three pointers of a payload (its id, its event type, its key). Valid
// and Find do that without decoding the payload into maps: Valid checks once what Decode
// checks, Find returns the raw text of the value a pointer names, and ScalarText renders
// it as Scalar would. For every document Valid accepts, Find and ScalarText give what
// Decode, Get and Scalar give (FuzzFind holds them equal).

// Valid reports whether Decode accepts raw, without decoding it: one JSON value of valid
// text, nothing but white space after it (Unicode white space, as Decode trims it), no
// escaped unpaired surrogate.
func Valid(raw []byte) bool {
	return utf8.Valid(raw) && json.Valid(bytes.TrimRightFunc(raw, unicode.IsSpace)) && !unpairedSurrogate(raw)
}

// Find returns the raw JSON text of the value ptr names in raw, a document Valid accepts.
// Where an object repeats a member, the last one counts, as it does for Decode.
func Find(raw []byte, ptr string) ([]byte, bool) {
	start := skipSpace(raw, 0)
	if start >= len(raw) {
		return nil, false
	}
	v := raw[start:valueEnd(raw, start)]
	if ptr == "" {
		return v, true
	}
	if ptr[0] != '/' {
		return nil, false
	}
	for rest := ptr[1:]; ; {
		tok, more, found := strings.Cut(rest, "/")
		if strings.IndexByte(tok, '~') >= 0 {
			tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		}
		var ok bool
		switch v[0] {
		case '{':
			v, ok = member(v, tok)
		case '[':
			v, ok = element(v, tok)
		}
		if !ok {
			return nil, false
		}
		if !found {
			return v, true
		}
		rest = more
	}
}

// ScalarText renders the raw value v (from Find) as Scalar renders the decoded one:
// strings unescaped, numbers as written, booleans as true or false; objects, arrays and
// null are not scalars.
func ScalarText(v []byte) (string, bool) {
	if len(v) == 0 {
		return "", false
	}
	switch v[0] {
	case '"':
		if bytes.IndexByte(v, '\\') < 0 {
			return string(v[1 : len(v)-1]), true
		}
		var s string
		if json.Unmarshal(v, &s) != nil {
			return "", false
		}
		return s, true
	case 't', 'f':
		return string(v), true
	case 'n', '{', '[':
		return "", false
	default:
		return string(v), true
	}
}

// member returns the value of the last member of object obj named key.
func member(obj []byte, key string) ([]byte, bool) {
	var (
		found []byte
		ok    bool
	)
	i := skipSpace(obj, 1)
	for i < len(obj) && obj[i] == '"' {
		kEnd := stringEnd(obj, i)
		k := obj[i+1 : kEnd-1]
		i = skipSpace(obj, kEnd)
		i = skipSpace(obj, i+1) // the colon
		vEnd := valueEnd(obj, i)
		if keyIs(k, key) {
			found, ok = obj[i:vEnd], true
		}
		i = skipSpace(obj, vEnd)
		if obj[i] == ',' {
			i = skipSpace(obj, i+1)
		}
	}
	return found, ok
}

// keyIs reports whether the raw member name k (between its quotes) is key.
func keyIs(k []byte, key string) bool {
	if bytes.IndexByte(k, '\\') < 0 {
		return string(k) == key
	}
	var s string
	q := make([]byte, 0, len(k)+2)
	q = append(append(append(q, '"'), k...), '"')
	return json.Unmarshal(q, &s) == nil && s == key
}

// element returns element tok (a decimal index, as Get reads it) of array arr.
func element(arr []byte, tok string) ([]byte, bool) {
	n, err := strconv.Atoi(tok)
	if err != nil || n < 0 || (len(tok) > 1 && tok[0] == '0') {
		return nil, false
	}
	i := skipSpace(arr, 1)
	for idx := 0; i < len(arr) && arr[i] != ']'; idx++ {
		end := valueEnd(arr, i)
		if idx == n {
			return arr[i:end], true
		}
		i = skipSpace(arr, end)
		if arr[i] == ',' {
			i = skipSpace(arr, i+1)
		}
	}
	return nil, false
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd is the index after the closing quote of the string starting at b[i].
func stringEnd(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(b)
}

// valueEnd is the index after the value starting at b[i] (the document is valid).
func valueEnd(b []byte, i int) int {
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				i = stringEnd(b, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
		return len(b)
	default: // a number or a literal
		for i < len(b) && (b[i] >= '0' && b[i] <= '9' || b[i] >= 'a' && b[i] <= 'z' || b[i] == 'E' || b[i] == '+' || b[i] == '-' || b[i] == '.') {
			i++
		}
		return i
	}
}

// Package jsonpointer resolves RFC 6901 JSON pointers ("/data/object/id") in documents
// decoded by encoding/json, which is how pipelines name message ids, keys and versions inside
// a payload. A well-kept general library (go-openapi/jsonpointer) exists, but it walks Go
// structs by reflection; idemd only ever needs decoded JSON, which this does in a few lines.
package jsonpointer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Decode decodes a payload in which pointers will be resolved: one JSON value of valid text,
// with nothing but white space after it (numbers as json.Number). ok is false otherwise.
// Text means valid UTF-8 without an escaped unpaired surrogate ("\ud800", "\udfff"):
// encoding/json would turn either into U+FFFD, so that ids that differ in the payload, such
// as "x\ud800" and "x\udbff", would read as one id.
func Decode(raw []byte) (doc any, ok bool) {
	if !utf8.Valid(raw) {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		return nil, false
	}
	if len(bytes.TrimSpace(raw[dec.InputOffset():])) != 0 || unpairedSurrogate(raw) {
		return nil, false
	}
	return doc, true
}

// unpairedSurrogate reports whether a JSON text (syntax already checked) escapes a UTF-16
// surrogate that is not half of a high-low pair.
func unpairedSurrogate(raw []byte) bool {
	for i := bytes.IndexByte(raw, '\\'); i >= 0 && i+1 < len(raw); {
		if raw[i+1] == 'u' {
			r := hex4(raw[i+2 : i+6])
			switch {
			case r >= 0xd800 && r < 0xdc00:
				if i+12 > len(raw) || raw[i+6] != '\\' || raw[i+7] != 'u' {
					return true
				}
				if lo := hex4(raw[i+8 : i+12]); lo < 0xdc00 || lo > 0xdfff {
					return true
				}
				i += 12
			case r >= 0xdc00 && r <= 0xdfff:
				return true
			default:
				i += 6
			}
		} else {
			i += 2 // an escaped character, possibly a backslash
		}
		j := bytes.IndexByte(raw[min(i, len(raw)):], '\\')
		if j < 0 {
			return false
		}
		i += j
	}
	return false
}

// hex4 is the value of four hex digits (checked by the JSON decoder).
func hex4(b []byte) rune {
	var r rune
	for _, c := range b {
		switch {
		case c >= 'a':
			c -= 'a' - 10
		case c >= 'A':
			c -= 'A' - 10
		default:
			c -= '0'
		}
		r = r<<4 | rune(c)
	}
	return r
}

// Validate reports whether ptr is a JSON pointer: "" (the whole document) or "/" followed
// by tokens in which "~" is only ever "~0" or "~1".
func Validate(ptr string) error {
	if ptr == "" {
		return nil
	}
	if ptr[0] != '/' {
		return fmt.Errorf("JSON pointer %q must start with /", ptr)
	}
	for i := 0; i < len(ptr); i++ {
		if ptr[i] == '~' && (i+1 == len(ptr) || (ptr[i+1] != '0' && ptr[i+1] != '1')) {
			return fmt.Errorf("JSON pointer %q has a ~ not followed by 0 or 1", ptr)
		}
	}
	return nil
}

// Get returns the value ptr names in doc, a value decoded by encoding/json (maps, slices,
// strings, json.Number or float64, bools, nil).
func Get(doc any, ptr string) (any, bool) {
	if ptr == "" {
		return doc, true
	}
	if ptr[0] != '/' {
		return nil, false
	}
	v := doc
	for _, tok := range strings.Split(ptr[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch x := v.(type) {
		case map[string]any:
			var ok bool
			if v, ok = x[tok]; !ok {
				return nil, false
			}
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(x) || (len(tok) > 1 && tok[0] == '0') {
				return nil, false
			}
			v = x[i]
		default:
			return nil, false
		}
	}
	return v, true
}

// Scalar renders a scalar as an id: strings as they are, numbers as written, booleans as
// true/false. Objects, arrays and null are not scalars. A document read with Decode holds
// no string an unpaired surrogate escape turned into U+FFFD, so two different ids never read
// as one.
func Scalar(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case json.Number:
		return x.String(), true
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64), true
	case bool:
		return strconv.FormatBool(x), true
	default:
		return "", false
	}
}

// Package jsonpointer resolves RFC 6901 JSON pointers ("/data/object/id") in documents
// decoded by encoding/json, which is how pipelines name message ids, keys and versions inside
// a payload. A well-kept general library (go-openapi/jsonpointer) exists, but it walks Go
// structs by reflection; idemd only ever needs decoded JSON, which this does in a few lines.
package jsonpointer

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

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

// Scalar renders a value found by Get as an id, a key or a version: strings as they are,
// numbers as written, booleans as true/false. Objects, arrays and null are not scalars,
// and neither is a string holding U+FFFD: encoding/json decodes every unpaired surrogate
// escape ("\ud800", "\udbff") to U+FFFD, so "x\ud800", "x\udbff" and "x\ufffd" would
// all read as one id (or one entity of the stale-event guard). Such a value is refused,
// like the invalid UTF-8 it stands for, rather than collapsed.
func Scalar(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		if strings.ContainsRune(x, utf8.RuneError) {
			return "", false
		}
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

package pipeline

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Composite ids. Some providers have no single id per event: an Adyen notification is unique
// by its eventCode and pspReference together, a status callback by its resource and its
// status. A composite Field reads each part and joins them with JoinParts, so that the id is
// the same on every retry of one event and differs between two events that differ in any
// part.

// JoinParts joins the parts of a composite value unambiguously: each part is written as its
// length in bytes, ':' and the part itself, and the parts are separated by '/'. ("a:b", "c")
// gives "3:a:b/1:c" and ("a", "b:c") gives "1:a/3:b:c": a plain separator would make both
// "a:b:c". A single part is returned as it is, so a composite of one part reads like the
// plain field.
func JoinParts(parts ...string) string {
	if len(parts) == 1 {
		return parts[0]
	}
	var b strings.Builder
	for i, p := range parts {
		if i > 0 {
			b.WriteByte('/')
		}
		b.WriteString(strconv.Itoa(len(p)))
		b.WriteByte(':')
		b.WriteString(p)
	}
	return b.String()
}

// Read reads f from a message through get, which reads one plain field (json, header or
// key) and reports whether it is present. A composite is read part by part and joined
// (JoinParts); it is missing (ok false) when any of its parts is missing or empty.
func (f *Field) Read(get func(*Field) (string, bool)) (string, bool) {
	if len(f.Parts) == 0 {
		return get(f)
	}
	parts := make([]string, len(f.Parts))
	for i := range f.Parts {
		v, ok := get(&f.Parts[i])
		if !ok || v == "" {
			return "", false
		}
		parts[i] = v
	}
	return JoinParts(parts...), true
}

func (f *Field) validateParts(door fieldDoor) error {
	if f.JSON != "" || f.Header != "" || f.Attribute != "" || f.Key {
		return errors.New("a composite lists its parts only: want a list of {json: …} or {header: …}")
	}
	for i := range f.Parts {
		p := &f.Parts[i]
		if len(p.Parts) > 0 {
			return fmt.Errorf("[%d]: a part is one json pointer or header, not a list", i)
		}
		if err := p.validate(door); err != nil {
			return fmt.Errorf("[%d]: %w", i, err)
		}
	}
	return nil
}

// UsesHeader reports whether f reads a header, itself or in one of its parts.
func (f *Field) UsesHeader() bool {
	if f.Header != "" {
		return true
	}
	for i := range f.Parts {
		if f.Parts[i].UsesHeader() {
			return true
		}
	}
	return false
}

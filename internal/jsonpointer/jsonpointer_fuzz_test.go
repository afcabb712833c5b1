package jsonpointer

import (
	"encoding/json"
	"strings"
	"testing"
)

// escape is the RFC 6901 encoding of one reference token.
func escape(tok string) string {
	return strings.ReplaceAll(strings.ReplaceAll(tok, "~", "~0"), "/", "~1")
}

// FuzzGet resolves hostile pointers in hostile documents (ids, keys and versions come from
// payloads the sender controls): no panic; a pointer built by escaping a key always finds
// that key's value; Validate accepts every pointer it builds; Scalar never panics.
func FuzzGet(f *testing.F) {
	f.Add([]byte(`{"id":"evt_1","data":{"object":{"id":"pi_1"}}}`), "/data/object/id", "a/b~c")
	f.Add([]byte(`{"a":[1,2,{"b":null}]}`), "/a/2/b", "")
	f.Add([]byte(`[0,1]`), "/01", "~1")
	f.Add([]byte(`{"":{"":1}}`), "//", "~0~1")
	f.Add([]byte(`"x"`), "/-", "\xff")
	f.Fuzz(func(t *testing.T, data []byte, ptr, key string) {
		var doc any
		if json.Unmarshal(data, &doc) != nil {
			doc = string(data)
		}
		if v, ok := Get(doc, ptr); ok {
			_, _ = Scalar(v)
			if Validate(ptr) != nil && ptr != "" && ptr[0] == '/' && !strings.Contains(ptr, "~") {
				t.Fatalf("Get resolved %q that Validate refuses", ptr)
			}
		}
		built := "/" + escape(key)
		if err := Validate(built); err != nil {
			t.Fatalf("Validate refuses the escaped pointer %q: %v", built, err)
		}
		wrapped := map[string]any{key: doc}
		got, ok := Get(wrapped, built)
		if !ok {
			t.Fatalf("Get(%q) did not find key %q", built, key)
		}
		a, _ := json.Marshal(got)
		b, _ := json.Marshal(doc)
		if string(a) != string(b) {
			t.Fatalf("Get(%q) = %s, want %s", built, a, b)
		}
	})
}

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

// FuzzFind holds Valid, Find and ScalarText to what Decode, Get and Scalar give, for any
// document and pointer: the receiver reads ids without decoding payloads, and an id must
// never read differently than it did.
func FuzzFind(f *testing.F) {
	f.Add([]byte(`{"id":"evt_1","type":"a.b","data":{"object":{"id":"pi_1"}}}`), "/data/object/id")
	f.Add([]byte(` {"id":1,"id":"second","x":[true,{"y":null}]} `), "/id")
	f.Add([]byte(`{"a\u0062":"\u00e9\ud83d\ude00","ab":2}`), "/ab")
	f.Add([]byte(`{"a":[0,1,2,[3]],"~/":{"":-1.5e3}}`), "/~0~1/")
	f.Add([]byte(`[[],{},"",0]`), "/03")
	f.Add([]byte(`{"x":"\ud800"}`), "/x")
	f.Add([]byte("\"\xff\""), "")
	f.Add([]byte(`{"a":1} {"b":2}`), "/a")
	f.Fuzz(func(t *testing.T, data []byte, ptr string) {
		doc, ok := Decode(data)
		if Valid(data) != ok {
			t.Fatalf("Valid(%q) = %v, Decode ok = %v", data, !ok, ok)
		}
		if !ok {
			return
		}
		want, wantOK := Get(doc, ptr)
		raw, gotOK := Find(data, ptr)
		if gotOK != wantOK {
			t.Fatalf("Find(%q, %q) found %v, Get %v", data, ptr, gotOK, wantOK)
		}
		if !wantOK {
			return
		}
		var got any
		dec := json.NewDecoder(strings.NewReader(string(raw)))
		dec.UseNumber()
		if err := dec.Decode(&got); err != nil {
			t.Fatalf("Find(%q, %q) = %q, not a value: %v", data, ptr, raw, err)
		}
		a, _ := json.Marshal(got)
		b, _ := json.Marshal(want)
		if string(a) != string(b) {
			t.Fatalf("Find(%q, %q) = %s, Get = %s", data, ptr, a, b)
		}
		ws, wok := Scalar(want)
		gs, gok := ScalarText(raw)
		if ws != gs || wok != gok {
			t.Fatalf("ScalarText(%q) = %q %v, Scalar = %q %v", raw, gs, gok, ws, wok)
		}
	})
}

package outbox

import (
	"encoding/json"
	"reflect"
	"testing"
)

// decodeHeaders answers as encoding/json does, for every input: the same map, or an error
// where it errs.
func FuzzDecodeHeaders(f *testing.F) {
	for _, s := range []string{
		`{"content-type": "application/json"}`,
		`{"content-type": "application/json", "event-type": "invoice.paid", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`,
		`{}`, ` { } `, `null`, ``, `{"a": "b",}`, `{"a": 1}`, `{"a": null}`, `{"a": "b" "c": "d"}`,
		`{"a": "b"} x`, `{"a": "\u00e9"}`, `{"a": "é"}`, `{"a": "\"q\""}`, `{"a": "x", "a": "y"}`,
		"{\"a\": \"\x01\"}", "{\"a\": \"\xff\"}", `{"a"}`, `{"a":`, `{"a": "b"`, `[]`, `"s"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var want map[string]string
		wantErr := json.Unmarshal(b, &want)
		got, err := decodeHeaders(b)
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("%q: error %v, encoding/json's %v", b, err, wantErr)
		}
		if err == nil && !reflect.DeepEqual(got, want) && !(len(got) == 0 && len(want) == 0) {
			t.Fatalf("%q: %#v, encoding/json's %#v", b, got, want)
		}
		if m, ok := decodeSimpleHeaders(b); ok && wantErr == nil && !reflect.DeepEqual(m, want) {
			t.Fatalf("%q: short path %#v, encoding/json's %#v", b, m, want)
		}
	})
}

func BenchmarkDecodeHeaders(b *testing.B) {
	in := []byte(`{"content-type": "application/json", "event-type": "invoice.paid"}`)
	b.Run("short path", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := decodeHeaders(in); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var m map[string]string
			if err := json.Unmarshal(in, &m); err != nil {
				b.Fatal(err)
			}
		}
	})
}

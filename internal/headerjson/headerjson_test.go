package headerjson

import (
	"encoding/json"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

func marshal(h map[string]string) string {
	if len(h) == 0 {
		return "{}"
	}
	b, err := json.Marshal(h)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// TestSameAsEncodingJSON: String writes what json.Marshal writes, on the short path and off it.
func TestSameAsEncodingJSON(t *testing.T) {
	many := map[string]string{}
	for i := range maxKeys + 1 {
		many["k"+strconv.Itoa(i)] = "v"
	}
	for _, h := range []map[string]string{
		nil, {},
		{"content-type": "application/json"},
		{"content-type": "application/json", "event-type": "order.created", "a": "", "": "empty key"},
		{"z": "1", "y": "2", "x": "3", "Z": "upper", "0": "digit"},
		{"html": "<b>&amp;</b>"}, {"quote": `say "hi"`}, {"back": `a\b`}, {"ctl": "a\nb\x00"},
		{"utf8": "café"}, {"bad": "\xff"}, {"sep": "\u2028"}, {"del": "\x7f"},
		many,
	} {
		require.Equal(t, marshal(h), String(h), "%q", h)
	}
}

// TestShortPathTaken: plain headers are written without encoding/json: one allocation, the
// string.
func TestShortPathTaken(t *testing.T) {
	h := map[string]string{"content-type": "application/json", "event-type": "order.created"}
	require.Equal(t, 1.0, testing.AllocsPerRun(100, func() { _ = String(h) }))
}

func FuzzSameAsEncodingJSON(f *testing.F) {
	f.Add("content-type", "application/json", "event-type", "x")
	f.Add("a", "<", "b", "\xff")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string) {
		h := map[string]string{k1: v1, k2: v2}
		if got, want := String(h), marshal(h); got != want {
			t.Fatalf("%q: got %s, want %s", h, got, want)
		}
	})
}

func BenchmarkString(b *testing.B) {
	h := map[string]string{"content-type": "application/json", "event-type": "order.created"}
	b.Run("headerjson", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = String(h)
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = marshal(h)
		}
	})
}

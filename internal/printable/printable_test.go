package printable

import (
	"encoding/json"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

func TestEscape(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"evt_1":                   "evt_1",
		"café ünïcode 日本":         "café ünïcode 日本",
		"a b":                     "a b",
		"\x1b[2J\x1b]0;pwned\x07": `\x1b[2J\x1b]0;pwned\x07`,
		"csi\u009b31m":            `csi\u009b31m`,
		"nel\u0085x":              `nel\u0085x`,
		"del\x7f":                 `del\x7f`,
		"bad\xff\xfeutf8":         `bad\xff\xfeutf8`,
		"rlo\u202egnp.exe":        `rlo\u202egnp.exe`,
		"line\u2028sep":           `line\u2028sep`,
		"tab\there\nnl\rcr":       `tab\there\nnl\rcr`,
		`back\slash`:              `back\\slash`,
		"nul\x00":                 `nul\x00`,
		"tag\U000e0041":           `tag\U000e0041`,
		"repl\ufffd":              "repl\ufffd",
	}
	for in, want := range cases {
		require.Equal(t, want, Escape(in), "%q", in)
	}
	// Two different inputs never print alike: a literal "\x1b" is not ESC.
	require.NotEqual(t, Escape(`\x1b`), Escape("\x1b"))
}

func TestLines(t *testing.T) {
	t.Parallel()
	require.Equal(t, "one \\x1b[31m\ntwo\\u009b", Lines("one \x1b[31m\ntwo\u009b"))
}

// TestEscapeOutputIsPrintable: whatever the input, the output is printable ASCII or
// printable runes only, and differs for different inputs.
func TestEscapeOutputIsPrintable(t *testing.T) {
	t.Parallel()
	seen := map[string]string{}
	for r := rune(0); r < 0x3000; r++ {
		for _, in := range []string{string(r), "x" + string(r), string([]byte{byte(r)})} {
			out := Escape(in)
			require.True(t, utf8.ValidString(out))
			for _, o := range out {
				require.True(t, unicode.IsPrint(o), "%q escaped to %q", in, out)
			}
			if prev, ok := seen[out]; ok {
				require.Equal(t, prev, in, "%q and %q print alike", prev, in)
			}
			seen[out] = in
		}
	}
}

func TestJSON(t *testing.T) {
	t.Parallel()
	v := map[string]string{"reason": "\u009b31mred\u202e \u2028 \U000e0041 ok é"}
	b, err := json.Marshal(v)
	require.NoError(t, err)
	out := JSON(append(b, '\n'))
	for _, r := range string(out) {
		require.True(t, unicode.IsPrint(r) || r == '\n', "%q left raw in %s", r, out)
	}
	var back map[string]string
	require.NoError(t, json.Unmarshal(out, &back))
	require.Equal(t, v, back, "the same document")
	plain := []byte(`{"a":"b"}`)
	require.Equal(t, plain, JSON(plain))
}

package fingerprint

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/jsonpointer"
)

func TestCanonical(t *testing.T) {
	t.Parallel()
	c, ok := Canonical([]byte(` { "b": [1, 2.50, {"z":null,"a":true}], "a": "x<y>&é" } `))
	require.True(t, ok)
	require.Equal(t, `{"a":"x<y>&é","b":[1,2.50,{"a":true,"z":null}]}`, string(c))

	_, ok = Canonical([]byte(`{"a":1} trailing`))
	require.False(t, ok)
	_, ok = Canonical([]byte(`not json`))
	require.False(t, ok)
}

func TestBodyIgnoresFieldsAndOrder(t *testing.T) {
	t.Parallel()
	a := Body([]byte(`{"id":"evt_1","pending_webhooks":2,"data":{"x":1}}`), "/pending_webhooks")
	b := Body([]byte(`{"data": {"x": 1}, "id": "evt_1", "pending_webhooks": 1}`), "/pending_webhooks")
	require.Equal(t, a, b)
	c := Body([]byte(`{"data":{"x":2},"id":"evt_1"}`), "/pending_webhooks")
	require.NotEqual(t, a, c)
	require.NotEqual(t, Body([]byte("raw")), Body([]byte("raw2")))
}

func TestRequest(t *testing.T) {
	t.Parallel()
	require.Equal(t, Request("POST", "/v1/orders", []byte(`{"a":1,"b":2}`)), Request("POST", "/v1/orders", []byte(`{"b":2, "a":1}`)))
	require.NotEqual(t, Request("POST", "/v1/orders", []byte(`{}`)), Request("PUT", "/v1/orders", []byte(`{}`)))
	require.NotEqual(t, Request("POST", "/v1/a", []byte(`{}`)), Request("POST", "/v1/b", []byte(`{}`)))
}

func TestInvalidUTF8IsNotJSON(t *testing.T) {
	t.Parallel()
	_, ok := Canonical([]byte("{\"id\":\"evt_\xff\"}"))
	require.False(t, ok, "invalid UTF-8 is fingerprinted as raw bytes")
	require.NotEqual(t, Body([]byte("{\"id\":\"evt_\xff\"}")), Body([]byte("{\"id\":\"evt_\xfe\"}")))
}

// An escaped surrogate that is not half of a valid pair is not text: decoded, it became
// U+FFFD, so "\ud800", "\udfff" and "\ufffd" shared one fingerprint (issue 11). Such a body
// is fingerprinted by its raw bytes, like invalid UTF-8.
func TestUnpairedSurrogatesAreNotJSON(t *testing.T) {
	t.Parallel()
	bodies := []string{
		`{"id":"\ud800"}`, `{"id":"\udfff"}`, `{"id":"\ufffd"}`, `{"id":"\uD800\u0041"}`,
		`{"id":"\udc00\ud800"}`, `{"id":"x\udbff"}`, `{"\ud800":1}`, `["\ud800"]`, `"\ud800"`,
		`{"id":"\ud800\\udc00"}`,
	}
	seen := map[string]string{}
	for _, b := range bodies {
		fp := string(Body([]byte(b)))
		if prev, ok := seen[fp]; ok {
			t.Fatalf("%s and %s share a fingerprint", prev, b)
		}
		seen[fp] = b
		if b != `{"id":"\ufffd"}` {
			_, ok := Canonical([]byte(b))
			require.False(t, ok, "%s has an unpaired surrogate: not JSON", b)
		}
	}
	// A valid pair is one character, the same however it is written.
	c, ok := Canonical([]byte(`{"e":"\ud83d\ude00","f":"\uD83D\uDE00"}`))
	require.True(t, ok)
	require.Equal(t, `{"e":"😀","f":"😀"}`, string(c))
	require.Equal(t, Body([]byte(`{"e":"😀"}`)), Body([]byte(`{"e":"\ud83d\ude00"}`)))
	require.NotEqual(t, Body([]byte(`{"id":"x\ud800"}`)), Body([]byte(`{"id":"x\udbff"}`)))
}

// corpus are bodies that exercise every branch of the canonical form: escapes of every kind,
// U+2028/2029, duplicate keys, keys needing escapes, nesting, numbers, white space, and bodies
// that are not JSON.
var corpus = []string{
	`{}`, `[]`, `""`, `0`, `-0`, `-1.5e+10`, `1E-2`, `true`, `false`, `null`, ` {"a" : [ ] } `,
	`{"a":1,"a":2}`, `{"b":{"x":1},"a":0,"b":{"y":2}}`, `{"a":1,"b":2,"a":3}`,
	`{"k\"ey":1,"k\\ey":2,"k\/ey":3,"key":4}`, `{"\u0000":1,"\u001f":2," ":3}`,
	`{"s":"\b\f\n\r\t\u0007\u007f\u0080"}`, `{"s":"\u2028\u2029 ` + "\u2028\u2029" + `"}`,
	`{"s":"<>&\u003c\u0026"}`, `{"s":"é\u00e9\u00E9"}`, `{"é":1,"e":2,"z":3,"É":4}`,
	`{"a":{"b":{"c":[1,{"d":"e"}]}}}`, `[[[[[]]]]]`, `[1,"two",3.0,{"four":4}]`,
	`{"id":"evt_1","pending_webhooks":1}`, "{\"a\":1}\n", "\t{\"a\":1}\r\n ", "{\"a\":1}\f",
	"{\"a\":1}\u00a0", "{\"a\":1}\u2028", `{"":1,"":2}`, `{"a~b":{"c/d":1}}`,
	`{"a":1} trailing`, `{"a":1}}`, `{"a":1,}`, `[1,]`, `{"a"}`, `{"a":}`, `{a:1}`, `01`, `1.`,
	`.5`, `-`, `1e`, `1e+`, `+1`, `nul`, `tru`, `"abc`, `"\x"`, `"\u12"`, `"\u12G4"`, "\"a\tb\"",
	`[1 2]`, `{"a":1 "b":2}`, ``, ` `, `{"a":[}`, `[{]`, "\xef\xbb\xbf{}", `"\ud83d\ude00"`,
	`{"a":NaN}`, `{"a":Infinity}`, `{"a":0x10}`, `{"a":1.0e0001}`, `[-0.0,0e0,0E+0]`,
	// Keys that agree on their first eight bytes, or differ only by trailing zero bytes
	// (the sort compares eight-byte prefixes first), and U+2028 in a key, raw.
	`{"abcdefgh2":1,"abcdefgh1":2,"abcdefgh":3,"abcdefg\u0000":4,"abcdefg":5,"abcdefgh1":6}`,
	"{\"k\u2028\":1,\"k\":2,\"\u2029\":3}",
	// More members than the insertion sort takes, out of order, one key twice.
	`{"t":20,"s":19,"r":18,"q":17,"p":16,"o":15,"n":14,"m":13,"l":12,"k":11,"j":10,"i":9,` +
		`"h":8,"g":7,"f":6,"e":5,"d":4,"c":3,"b":2,"a":1,"k":0}`,
}

func TestMatchesReferenceOnCorpus(t *testing.T) {
	t.Parallel()
	ignores := [][]string{nil, {"/a"}, {"/b/x", "/a"}, {"/a~1b"}, {"/a~0b/c~1d"}, {"/"}, {""}, {"a"}, {"/pending_webhooks", "/data/object/id"}}
	for _, b := range append(corpus, generated(500)...) {
		for _, ig := range ignores {
			compareWithReference(t, []byte(b), ig...)
		}
	}
}

func TestNestingLimitIsEncodingJSONs(t *testing.T) {
	t.Parallel()
	for _, depth := range []int{maxDepth - 1, maxDepth, maxDepth + 1} {
		for _, open := range []string{"[", `{"a":`} {
			closer := map[string]string{"[": "]", `{"a":`: "}"}[open]
			b := []byte(strings.Repeat(open, depth) + "1" + strings.Repeat(closer, depth))
			compareWithReference(t, b)
			_, ok := Canonical(b)
			require.Equal(t, depth <= maxDepth, ok, "depth %d", depth)
		}
	}
}

func TestBodyJSONIsEncodingJSONsVerdict(t *testing.T) {
	t.Parallel()
	bodies := append([]string{"", " ", "1 \f", "1\v", "{} \u00a0", "[1] \n\t\r ", `"\ud800"`, "\xff", `{"a":1}x`, `{"a":"\x01"}`,
		strings.Repeat("[", maxDepth) + strings.Repeat("]", maxDepth), strings.Repeat("[", maxDepth+1) + strings.Repeat("]", maxDepth+1)},
		corpus...)
	for _, b := range append(bodies, generated(200)...) {
		checkBodyJSON(t, []byte(b))
	}
}

// checkBodyJSON holds BodyJSON to Body and to encoding/json's verdict.
func checkBodyJSON(t testing.TB, body []byte) {
	t.Helper()
	fp, isJSON := BodyJSON(body)
	require.Equal(t, Body(body), fp, "%q", body)
	require.Equal(t, json.Valid(body) && utf8.Valid(body), isJSON, "%q", body)
}

func FuzzBodyJSON(f *testing.F) {
	for _, s := range append([]string{"1 \f", `"\ud800"`, "\xff"}, corpus...) {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) { checkBodyJSON(t, body) })
}

func compareWithReference(t testing.TB, body []byte, ignore ...string) {
	t.Helper()
	want, wantOK := referenceCanonical(body, ignore...)
	got, gotOK := Canonical(body, ignore...)
	// The doors read ids from the same bodies that fingerprint as JSON.
	_, decodeOK := jsonpointer.Decode(body)
	require.Equal(t, gotOK, decodeOK, "%q: Canonical and jsonpointer.Decode disagree", body)
	// The receiver takes a webhook's canonical form for jsonpointer.Valid's verdict.
	require.Equal(t, gotOK, jsonpointer.Valid(body), "%q: Canonical and jsonpointer.Valid disagree", body)
	fp, canonical := BodyCanonical(body, ignore...)
	require.Equal(t, gotOK, canonical, "%q: BodyCanonical's verdict", body)
	require.Equal(t, Body(body, ignore...), fp)
	if wantOK && !gotOK {
		// The one difference: an unpaired surrogate, which the reference decoded as U+FFFD.
		require.Contains(t, string(want), "\ufffd", "%q is JSON to the reference only", body)
		require.Contains(t, string(body), `\u`, "%q is JSON to the reference only", body)
		return
	}
	require.Equal(t, wantOK, gotOK, "%q ignore %q", body, ignore)
	require.Equal(t, string(want), string(got), "%q ignore %q", body, ignore)
	if gotOK {
		require.Equal(t, Sum([]byte("json"), want), Body(body, ignore...))
	} else {
		require.Equal(t, Sum([]byte("raw"), body), Body(body, ignore...))
	}
}

// generated returns n random JSON documents, with random spacing, key order, duplicates and
// escapes, from a fixed seed.
func generated(n int) []string {
	rng := rand.New(rand.NewPCG(7, 11))
	out := make([]string, n)
	for i := range out {
		var sb strings.Builder
		genValue(rng, &sb, 0)
		out[i] = sb.String()
	}
	return out
}

var genStrings = []string{`a`, `b`, `id`, `pending_webhooks`, `data`, `x`, `é`, `\u00e9`, `\"`, `\\`, `\/`, `\n`,
	`\u0001`, `\u2028`, "\u2029", `\ud83d\ude00`, `a~b`, `c/d`, ``, `\t<&>`, "日本", `\u65e5`, `Z`, `z`}

func genString(rng *rand.Rand) string {
	var sb strings.Builder
	for range rng.IntN(3) + 1 {
		sb.WriteString(genStrings[rng.IntN(len(genStrings))])
	}
	return sb.String()
}

func genSpace(rng *rand.Rand, sb *strings.Builder) {
	sb.WriteString([]string{"", "", " ", "\n", "\t ", "\r\n"}[rng.IntN(6)])
}

func genValue(rng *rand.Rand, sb *strings.Builder, depth int) {
	k := rng.IntN(8)
	if depth > 4 {
		k = 2 + rng.IntN(6)
	}
	switch k {
	case 0, 1:
		sb.WriteByte('{')
		for j := range rng.IntN(5) {
			if j > 0 {
				sb.WriteByte(',')
			}
			genSpace(rng, sb)
			fmt.Fprintf(sb, `"%s"`, genString(rng))
			genSpace(rng, sb)
			sb.WriteByte(':')
			genSpace(rng, sb)
			genValue(rng, sb, depth+1)
		}
		genSpace(rng, sb)
		sb.WriteByte('}')
	case 2:
		sb.WriteByte('[')
		for j := range rng.IntN(4) {
			if j > 0 {
				sb.WriteByte(',')
			}
			genValue(rng, sb, depth+1)
		}
		sb.WriteByte(']')
	case 3, 4:
		fmt.Fprintf(sb, `"%s"`, genString(rng))
	case 5:
		sb.WriteString([]string{"0", "-1", "2.50", "1e10", "-0.0e-3", "123456789012345678901234567890"}[rng.IntN(6)])
	default:
		sb.WriteString([]string{"true", "false", "null"}[rng.IntN(3)])
	}
}

func FuzzCanonical(f *testing.F) {
	for _, s := range []string{`{"a":1}`, `[1,"x",null]`, `{"b":{"c":[true,false]},"a":"é"}`, `"s"`, `1e10`, `{`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		c, ok := Canonical(body)
		if !ok {
			return
		}
		// The canonical form is itself canonical, and means the same document.
		c2, ok := Canonical(c)
		if !ok {
			t.Fatalf("canonical form %q does not parse", c)
		}
		if string(c) != string(c2) {
			t.Fatalf("not idempotent: %q -> %q", c, c2)
		}
	})
}

// FuzzMatchesReference holds the streaming canonical form to the decode-and-re-encode one it
// replaced, with ignored fields, on any input.
func FuzzMatchesReference(f *testing.F) {
	for _, s := range corpus {
		f.Add([]byte(s), "/a", "/b/x")
	}
	f.Fuzz(func(t *testing.T, body []byte, p1, p2 string) {
		compareWithReference(t, body, p1, p2)
	})
}

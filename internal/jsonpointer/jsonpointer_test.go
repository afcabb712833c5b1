package jsonpointer

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func decode(t *testing.T, s string) any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader([]byte(s)))
	d.UseNumber()
	var v any
	require.NoError(t, d.Decode(&v))
	return v
}

func TestGet(t *testing.T) {
	t.Parallel()
	doc := decode(t, `{"id":"evt_1","data":{"object":{"id":"pi_1","amount":1000}},"a/b":{"m~n":true},"list":[10,20],"n":null}`)
	cases := []struct {
		ptr  string
		want string
		ok   bool
	}{
		{"/id", "evt_1", true},
		{"/data/object/id", "pi_1", true},
		{"/data/object/amount", "1000", true},
		{"/a~1b/m~0n", "true", true},
		{"/list/1", "20", true},
		{"/list/2", "", false},
		{"/list/01", "", false},
		{"/missing", "", false},
		{"/data", "", false}, // an object is not a scalar
		{"/n", "", false},
		{"id", "", false},
	}
	for _, c := range cases {
		v, ok := Get(doc, c.ptr)
		if ok {
			var s string
			s, ok = Scalar(v)
			if ok {
				require.Equal(t, c.want, s, c.ptr)
			}
		}
		require.Equal(t, c.ok, ok, c.ptr)
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	require.NoError(t, Validate(""))
	require.NoError(t, Validate("/data/object/id"))
	require.NoError(t, Validate("/a~0b~1c"))
	require.Error(t, Validate("data/id"))
	require.Error(t, Validate("/a~2"))
	require.Error(t, Validate("/a~"))
}

// TestScalarRefusesLoneSurrogates: encoding/json decodes every unpaired surrogate escape to
// U+FFFD, so ids that differ only there would read alike; Scalar refuses them all, and a
// properly paired surrogate (a real character) still reads.
func TestScalarRefusesLoneSurrogates(t *testing.T) {
	t.Parallel()
	for _, id := range []string{`"x\ud800"`, `"x\udbff"`, `"x\udfff"`, `"x\ufffd"`, `"x\ud800\u0041"`, "\"x\xef\xbf\xbd\""} {
		doc := decode(t, `{"id":`+id+`}`)
		v, ok := Get(doc, "/id")
		require.True(t, ok)
		s, ok := Scalar(v)
		require.False(t, ok, "%s read as %q", id, s)
	}
	doc := decode(t, `{"id":"x\ud83d\ude00"}`)
	v, _ := Get(doc, "/id")
	s, ok := Scalar(v)
	require.True(t, ok)
	require.Equal(t, "x😀", s)
}

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

// Ids read from a payload must not merge: invalid UTF-8 and escaped unpaired surrogates
// (which encoding/json decodes as U+FFFD) make the payload not JSON, so no id is read.
func TestDecodeRefusesWhatWouldMergeIDs(t *testing.T) {
	t.Parallel()
	for _, body := range []string{
		`{"id":"x\ud800"}`, `{"id":"x\udbff"}`, `{"id":"x\udfff"}`, `{"id":"x\uD800\u0041"}`,
		`{"id":"x\udc00\ud800"}`, `{"id":"x\ud800\\udc00"}`, `{"\ud800":1}`, "{\"id\":\"x\xff\"}",
		`{"id":"x"} trailing`, `{"id":"x"}}`, `{"id":`,
	} {
		_, ok := Decode([]byte(body))
		require.False(t, ok, body)
	}
	ids := map[string]string{}
	for _, body := range []string{
		`{"id":"x\ufffd"}`, `{"id":"x\ud83d\ude00"}`, `{"id":"x\uD83D\uDE00 "}`, `{"id":"x\\ud800"}`,
		`{"id":"x\\\ud83d\ude00"}`, `{"id":"x"}` + " \n", `{"id":"x\u00e9"}`,
	} {
		doc, ok := Decode([]byte(body))
		require.True(t, ok, body)
		v, ok := Get(doc, "/id")
		require.True(t, ok, body)
		id, _ := Scalar(v)
		if prev, dup := ids[id]; dup {
			t.Fatalf("%s and %s read as one id %q", prev, body, id)
		}
		ids[id] = body
	}
	doc, ok := Decode([]byte(`{"id":"\ud83d\ude00"}`))
	require.True(t, ok)
	require.Equal(t, map[string]any{"id": "😀"}, doc)
}

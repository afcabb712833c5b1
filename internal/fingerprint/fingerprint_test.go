package fingerprint

import (
	"testing"

	"github.com/stretchr/testify/require"
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

func TestInvalidUTF8IsNotJSON(t *testing.T) {
	t.Parallel()
	_, ok := Canonical([]byte("{\"id\":\"evt_\xff\"}"))
	require.False(t, ok, "invalid UTF-8 is fingerprinted as raw bytes")
	require.NotEqual(t, Body([]byte("{\"id\":\"evt_\xff\"}")), Body([]byte("{\"id\":\"evt_\xfe\"}")))
}

package idemkey_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/idemkey"
)

// Every valid key that Format writes, Parse reads back as the same key; a token goes bare.
func TestFormatParsesBack(t *testing.T) {
	t.Parallel()
	var all strings.Builder
	for c := byte(0x20); c <= 0x7e; c++ {
		all.WriteByte(c)
	}
	for _, k := range []string{
		"123e4567-e89b-12d3-a456-426614174000", "order,42", `"quoted"`, `back\slash`, " padded ",
		"(inner)", "a;b=1", "x", all.String(), strings.Repeat("k", idemkey.MaxLen), strings.Repeat(",", idemkey.MaxLen),
	} {
		v := idemkey.Format(k)
		got, err := idemkey.Parse([]string{v})
		require.NoError(t, err, "key %q sent as %q", k, v)
		require.Equal(t, k, got, "sent as %q", v)
	}
	require.Equal(t, "123e4567-e89b-12d3-a456-426614174000", idemkey.Format("123e4567-e89b-12d3-a456-426614174000"))
	require.Equal(t, `"order,42"`, idemkey.Format("order,42"))
}

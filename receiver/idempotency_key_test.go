package receiver

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseIdempotencyKey(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("k", 255)
	for _, tc := range []struct {
		in   []string
		want string
		err  error
	}{
		{[]string{"abc"}, "abc", nil},
		{[]string{`"abc"`}, "abc", nil},
		{[]string{` "abc" `}, "abc", nil},
		{[]string{`"a\"b\\c"`}, `a"b\c`, nil},
		{[]string{`"abc";p=1`}, "abc", nil},
		{[]string{"6f1b2c9e-4c1a-4b7e-9d1e-0a6c2f6a1b10"}, "6f1b2c9e-4c1a-4b7e-9d1e-0a6c2f6a1b10", nil},
		{[]string{long}, long, nil},
		{[]string{long + "k"}, "", ErrInvalidKey},
		{[]string{`"` + long + `k"`}, "", ErrInvalidKey},
		{nil, "", ErrNoKey},
		{[]string{""}, "", ErrEmptyKey},
		{[]string{" \t "}, "", ErrEmptyKey},
		{[]string{`""`}, "", ErrInvalidKey},
		{[]string{"a", "b"}, "", ErrManyKeys},
		{[]string{"a,b"}, "", ErrCommaKey},
		{[]string{`"a,b"`}, "a,b", nil},
		{[]string{`"a", "b"`}, "", ErrManyKeys},
		{[]string{`("a" "b")`}, "", ErrManyKeys},
		{[]string{`("a")`}, "", ErrManyKeys},
		{[]string{`(a b);p=1`}, "", ErrManyKeys},
		{[]string{`"(a b)"`}, "(a b)", nil},
		{[]string{`"abc`}, "", ErrMalformedKey},
		{[]string{`"a\nb"`}, "", ErrMalformedKey},
		{[]string{"caf\u00e9"}, "", ErrInvalidKey},
		{[]string{"a\x00b"}, "", ErrInvalidKey},
		{[]string{`"abc"x`}, "", ErrMalformedKey},
	} {
		got, err := ParseIdempotencyKey(tc.in)
		if tc.err != nil {
			require.ErrorIs(t, err, tc.err, "%q", tc.in)
			require.Equal(t, tc.err.Error(), err.Error(), "%q: the detail says why", tc.in)
			continue
		}
		require.NoError(t, err, "%q", tc.in)
		require.Equal(t, tc.want, got)
	}
}

func FuzzIdempotencyKey(f *testing.F) {
	for _, s := range []string{"abc", `"abc"`, `"a\"b"`, `"a";x`, "a,b", `("a" "b")`, `"`, "", strings.Repeat("z", 256)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		k, err := ParseIdempotencyKey([]string{s})
		if err != nil {
			return
		}
		if !ValidKey(k) {
			t.Fatalf("accepted invalid key %q from %q", k, s)
		}
		// The quoted form of an accepted key means the same key.
		q := `"` + strings.ReplaceAll(strings.ReplaceAll(k, `\`, `\\`), `"`, `\"`) + `"`
		k2, err := ParseIdempotencyKey([]string{q})
		if err != nil || k2 != k {
			t.Fatalf("quoted %q gives %q, %v; bare gives %q", q, k2, err, k)
		}
	})
}

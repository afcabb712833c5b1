package processed

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestValidID(t *testing.T) {
	t.Parallel()
	for _, id := range []string{"evt_1", "clé-日本", strings.Repeat("x", MaxIDLength), "a b", "x\u00a0y", "x\ufffd"} {
		require.True(t, ValidID(id), "%q", id)
	}
	for _, id := range []string{"", strings.Repeat("x", MaxIDLength+1), "a\x00b", "a\x1b[2J", "a\x7f", "bad\xff",
		"nel\u0085", "csi\u009b31m", "c1\u0080", "c1\u009f", " ", "   ", "\u00a0", " \u2003 "} {
		require.False(t, ValidID(id), "%q", id)
	}
}

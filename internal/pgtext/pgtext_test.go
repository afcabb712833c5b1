package pgtext

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestClean(t *testing.T) {
	t.Parallel()
	require.Equal(t, "plain é", Clean("plain é"))
	require.Equal(t, "a\uFFFDb", Clean("a\x00b"))
	require.Equal(t, "id-\uFFFD", Clean("id-\xff\xfe"))
}

package sqlwhere

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestWhereNumbersPlaceholdersInOrder(t *testing.T) {
	var w Where
	require.Equal(t, "", w.SQL())
	w.Add("a = ?", 1)
	w.Add("(b = ? OR c LIKE ?)", "x", "y%")
	limit := w.Arg(10)
	require.Equal(t, " WHERE a = $1 AND (b = $2 OR c LIKE $3)", w.SQL())
	require.Equal(t, "$4", limit)
	require.Equal(t, []any{1, "x", "y%", 10}, w.Args())
	require.Equal(t, `50\%\_off\\`, Like(`50%_off\`))
}

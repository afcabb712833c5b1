package outbox

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
)

// The relay's select runs with bitmap scans off, and only it: the setting does not stay on
// the pooled connection for whoever uses it next.
func TestQueryNoBitmapIsLocalToTheStatement(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, 1)
	ctx := context.Background()
	rows, done, err := queryNoBitmap(ctx, pool, "SELECT current_setting('enable_bitmapscan')")
	require.NoError(t, err)
	require.True(t, rows.Next())
	var during string
	require.NoError(t, rows.Scan(&during))
	rows.Close()
	require.NoError(t, rows.Err())
	require.NoError(t, done())
	require.Equal(t, "off", during)

	var after string
	require.NoError(t, pool.QueryRow(ctx, "SELECT current_setting('enable_bitmapscan')").Scan(&after))
	require.Equal(t, "on", after, "the same (only) connection, next statement")
}

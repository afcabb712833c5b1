package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
)

// TestMigratePrints: migrate names each migration it applies, and says so when there was
// nothing to do.
func TestMigratePrints(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("../../migrations/*.sql")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	schema := testSchema(t)
	vars := map[string]string{"IDEMD_DATABASE_URL": pgtest.URL(), "IDEMD_DB_SCHEMA": schema}

	code, out, errOut := runIdemd(t, vars, "migrate")
	require.Equal(t, 0, code, errOut)
	var want strings.Builder
	for i, f := range files {
		fmt.Fprintf(&want, "applying %s (version %d)\n", strings.TrimSuffix(filepath.Base(f), ".sql"), i+1)
	}
	fmt.Fprintf(&want, "schema %s is at version %d: %d migration(s) applied\n", schema, len(files), len(files))
	require.Equal(t, want.String(), out)

	code, out, errOut = runIdemd(t, vars, "migrate")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, fmt.Sprintf("nothing to do: schema %s is already at version %d, the latest\n", schema, len(files)), out)
}

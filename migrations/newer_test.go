package migrations_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/migrations"
)

// TestApplyRefusesANewerSchema: a schema migrated by a later idemd (here, its version moved
// one past this binary's last migration) is not migrated, and the error says so in words an
// operator acts on, rather than tern's "outside the valid versions".
func TestApplyRefusesANewerSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema, q, _ := migrationTest(t)
	cfg := &migrations.Config{Schema: schema}
	require.NoError(t, migrations.Apply(ctx, pool, cfg))
	_, err := pool.Exec(ctx, "UPDATE "+q+".schema_version SET version = version + 1")
	require.NoError(t, err)

	st, err := migrations.CurrentStatus(ctx, pool, cfg)
	require.NoError(t, err)
	require.True(t, st.Newer())
	require.True(t, st.UpToDate(), "a newer schema holds every migration this binary has")

	err = migrations.Apply(ctx, pool, cfg)
	require.ErrorIs(t, err, migrations.ErrSchemaNewer)
	require.ErrorContains(t, err, "past this idemd's last migration")
	require.ErrorContains(t, err, "IDEMD_MIGRATE=false")
	after, err := migrations.CurrentStatus(ctx, pool, cfg)
	require.NoError(t, err)
	require.Equal(t, st, after, "nothing changed")
}

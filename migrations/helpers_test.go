package migrations_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/migrations"
)

// migrationTest is a fresh schema for the test of one migration: a pool, the schema and its
// quoted name, and to, which migrates it up or down to a version.
func migrationTest(t *testing.T) (pool *pgxpool.Pool, schema, q string, to func(version int32)) {
	t.Helper()
	ctx := context.Background()
	pool = pgtest.Pool(t, 2)
	schema = pgtest.SchemaName(t)
	q = pgx.Identifier{schema}.Sanitize()
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+q+" CASCADE") })
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	t.Cleanup(conn.Release)
	return pool, schema, q, func(v int32) {
		require.NoError(t, migrations.MigrateTo(ctx, conn.Conn(), schema, v), "to version %d", v)
	}
}

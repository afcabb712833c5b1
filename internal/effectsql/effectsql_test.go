package effectsql_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/effectsql"
	"github.com/idemd/idemd/internal/pgtest"
)

func TestCompile(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	db.Exec(t, db.Q("CREATE TABLE {schema}.t (id text, body jsonb)"))
	conn, err := db.Pool.Acquire(context.Background())
	require.NoError(t, err)
	defer conn.Release()
	ctx := context.Background()

	sql, names, err := effectsql.Compile(ctx, conn.Conn(), db.Q("INSERT INTO {schema}.t VALUES (@message_id, @payload::jsonb), (@message_id, NULL)"))
	require.NoError(t, err)
	require.Contains(t, sql, "$1")
	require.Equal(t, []string{"message_id", "payload"}, names)

	_, _, err = effectsql.Compile(ctx, conn.Conn(), db.Q("INSERT INTO {schema}.t VALUES (@message_id, @nope)"))
	require.ErrorIs(t, err, effectsql.ErrUnknownParameter)
	require.ErrorContains(t, err, "@nope")

	_, _, err = effectsql.Compile(ctx, conn.Conn(), "INSERT INTO missing_table VALUES (@message_id)")
	require.ErrorContains(t, err, "42P01")
}

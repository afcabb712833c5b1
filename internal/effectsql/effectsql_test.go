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

// TestAppendArgs: AppendArgs binds what Bind binds, after what dst holds, in dst's room
// when it has enough (stale values in that room are overwritten, NULLs included).
func TestAppendArgs(t *testing.T) {
	t.Parallel()
	s := &effectsql.Statement{Params: []string{"message_id", "payload", "topic", "partition", "offset", "tenant"}}
	v := &effectsql.Values{MessageID: "m1", Payload: []byte(`{}`), Position: effectsql.Position{Topic: "t", Partition: 2, Offset: 7}}
	want := []any{"m1", "{}", "t", 2, int64(7), nil}
	require.Equal(t, want, s.Bind(v))
	var room [8]any
	for i := range room {
		room[i] = "stale"
	}
	got := s.AppendArgs(room[:1], v)
	require.Equal(t, append([]any{"stale"}, want...), got)
	require.Same(t, &room[0], &got[0], "in dst's room")
	require.Len(t, s.AppendArgs(room[:3], v), 9, "grown past dst's room")
}

package effectsql_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/effectsql"
	"github.com/idemd/idemd/internal/pgtest"
)

// Only a single-row INSERT of parameters and constants into a plain table, without
// RETURNING or statement-level triggers or rules, has a multi-message form.
func TestPrepareMany(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	db.Exec(t, db.Q(`CREATE TABLE {schema}.t (id bigint GENERATED ALWAYS AS IDENTITY, message_id text PRIMARY KEY, body jsonb, part int, at timestamptz, note text)`))
	db.Exec(t, db.Q(`CREATE TABLE {schema}.stmt_trigger (message_id text)`))
	db.Exec(t, db.Q(`CREATE FUNCTION {schema}.noop() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NULL; END'`))
	db.Exec(t, db.Q(`CREATE TRIGGER once AFTER INSERT ON {schema}.stmt_trigger FOR EACH STATEMENT EXECUTE FUNCTION {schema}.noop()`))
	db.Exec(t, db.Q(`CREATE TABLE {schema}.row_trigger (message_id text)`))
	db.Exec(t, db.Q(`CREATE TRIGGER each AFTER INSERT ON {schema}.row_trigger FOR EACH ROW EXECUTE FUNCTION {schema}.noop()`))
	db.Exec(t, db.Q(`CREATE TABLE {schema}.ruled (message_id text)`))
	db.Exec(t, db.Q(`CREATE RULE nothing AS ON INSERT TO {schema}.ruled DO ALSO NOTIFY ruled`))
	db.Exec(t, db.Q(`CREATE VIEW {schema}.v AS SELECT message_id FROM {schema}.t`))
	conn, err := db.Pool.Acquire(context.Background())
	require.NoError(t, err)
	defer conn.Release()
	ctx := context.Background()

	for sql, many := range map[string]bool{
		"INSERT INTO {schema}.t (message_id, body, part) VALUES (@message_id, @payload::jsonb, @partition)":                true,
		"insert into {schema}.t as x (message_id, note) values (@message_id, 'it''s') on conflict (message_id) do nothing": true,
		"INSERT INTO {schema}.t (message_id, at, note) VALUES (@message_id, @received_at, NULL);":                          true,
		"INSERT INTO {schema}.row_trigger VALUES (@message_id)":                                                            true,
		"INSERT INTO {schema}.t (message_id) VALUES (@message_id) ON CONFLICT ON CONSTRAINT t_pkey DO NOTHING":             true,
		"INSERT INTO {schema}.t (message_id) VALUES (@message_id) RETURNING id":                                            false,
		"INSERT INTO {schema}.t (message_id) VALUES (@message_id) ON CONFLICT (message_id) DO UPDATE SET note = 'again'":   false,
		"INSERT INTO {schema}.t (message_id, note) VALUES (@message_id, (SELECT 'x'))":                                     false,
		"INSERT INTO {schema}.t (message_id, note) VALUES (@message_id, upper(@source))":                                   false,
		"INSERT INTO {schema}.t (message_id) VALUES (@message_id), (@message_id || '-2')":                                  false,
		"INSERT INTO {schema}.t (message_id, at) VALUES (@message_id, now())":                                              false,
		"INSERT INTO {schema}.stmt_trigger VALUES (@message_id)":                                                           false,
		"INSERT INTO {schema}.ruled VALUES (@message_id)":                                                                  false,
		"INSERT INTO {schema}.v VALUES (@message_id)":                                                                      false,
		"UPDATE {schema}.t SET note = @source WHERE message_id = @message_id":                                              false,
		"WITH x AS (SELECT 1) INSERT INTO {schema}.t (message_id) VALUES (@message_id)":                                    false,
		"INSERT INTO {schema}.t (message_id) VALUES (@message_id) -- a comment":                                            false,
	} {
		st, err := effectsql.Prepare(ctx, conn.Conn(), db.Q(sql))
		require.NoError(t, err, sql)
		require.Equal(t, many, st.Many != "", "%s\n%s", sql, st.Many)
	}
}

// The multi-message form does what the statement does once per message, in order:
// the same rows, identity values in message order, NULLs and casts, and DO NOTHING for a
// key repeated within the batch.
func TestManyMatchesOneByOne(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	for _, tbl := range []string{"one", "many"} {
		db.Exec(t, db.Q(`CREATE TABLE {schema}.`+tbl+` (id bigint GENERATED ALWAYS AS IDENTITY, message_id text PRIMARY KEY, body jsonb, part int, at timestamptz, tenant text, src text)`))
	}
	conn, err := db.Pool.Acquire(context.Background())
	require.NoError(t, err)
	defer conn.Release()
	ctx := context.Background()
	prepare := func(tbl string) *effectsql.Statement {
		st, err := effectsql.Prepare(ctx, conn.Conn(), db.Q(`INSERT INTO {schema}.`+tbl+` (message_id, body, part, at, tenant, src)
VALUES (@message_id, @payload::jsonb, @partition, @received_at, @tenant, 'fixed, $1 ''quoted''') ON CONFLICT (message_id) DO NOTHING`))
		require.NoError(t, err)
		return st
	}
	one, many := prepare("one"), prepare("many")
	require.NotEmpty(t, many.Many)

	at := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)
	var values []*effectsql.Values
	for i := range 50 {
		v := &effectsql.Values{MessageID: fmt.Sprintf("m-%02d", (i*7)%45), Payload: fmt.Appendf(nil, `{"n":%d}`, i), ReceivedAt: at.Add(time.Duration(i) * time.Second),
			Position: effectsql.Position{Topic: "t", Partition: i % 3, Offset: int64(i)}}
		if i%4 == 0 {
			v.Tenant = "acme"
		}
		if i%5 == 0 {
			v.Position = effectsql.Position{} // NULL partition
		}
		values = append(values, v)
	}
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	cols := make([][]any, len(many.Params))
	for _, v := range values {
		_, err := tx.Exec(ctx, one.SQL, one.Bind(v)...)
		require.NoError(t, err)
		for k, a := range many.Bind(v) {
			cols[k] = append(cols[k], a)
		}
	}
	args := make([]any, len(cols))
	for k := range cols {
		args[k] = cols[k]
	}
	_, err = tx.Exec(ctx, many.Many, args...)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	read := func(tbl string) []map[string]any {
		rows, err := db.Pool.Query(ctx, db.Q(`SELECT id, message_id, body, part, at, tenant, src FROM {schema}.`+tbl+` ORDER BY id`))
		require.NoError(t, err)
		out, err := pgx.CollectRows(rows, pgx.RowToMap)
		require.NoError(t, err)
		return out
	}
	want := read("one")
	require.Len(t, want, 45, "repeated keys did nothing")
	require.Equal(t, want, read("many"))
}

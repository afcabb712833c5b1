package migrations_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/migrations"
)

// The admin API's lookups by an id (a message across pipelines, an outbox row or an HTTP
// delivery by operation or causation id) are equalities on random keys; migration 0007
// serves them with hash indexes.
var idLookups = []struct{ table, column, index string }{
	{"processed_messages", "message_id", "processed_messages_message_id_hash_idx"},
	{"outbox", "operation_id", "outbox_operation_id_hash_idx"},
	{"outbox", "causation_id", "outbox_causation_id_hash_idx"},
	{"http_deliveries", "operation_id", "http_deliveries_operation_id_hash_idx"},
	{"http_deliveries", "causation_id", "http_deliveries_causation_id_hash_idx"},
}

// Every lookup by id reads its index: with sequential scans priced out, the plan names the
// hash index (it would be a sequential scan without an index on the column).
func TestLookupsByIDReadTheirHashIndexes(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	for _, l := range idLookups {
		t.Run(l.table+"."+l.column, func(t *testing.T) {
			plan := explain(t, db, fmt.Sprintf("SELECT * FROM %s.%s WHERE %s = $1",
				pgx.Identifier{db.Schema}.Sanitize(), l.table, l.column), "00000000-0000-0000-0000-000000000001")
			require.Contains(t, plan, l.index, "plan:\n%s", plan)
			require.Equal(t, "hash", indexMethod(ctx, t, db, l.index))
		})
	}
}

// Migration 0007 goes down to the B-trees of 0002 and 0004 and up again.
func TestHashIndexesMigrateDownAndUp(t *testing.T) {
	t.Parallel()
	db, conn := migratedTo(t, 6)
	requireLookupIndexes(t, db, "btree")
	require.NoError(t, migrations.MigrateTo(context.Background(), conn, db.Schema, 7))
	requireLookupIndexes(t, db, "hash")
}

// The upgrade of a large database (docs/daemon.md, "Upgrading"): the hash indexes built
// beforehand with CREATE INDEX CONCURRENTLY, under their names, while the daemon writes;
// the migration keeps them and drops the B-trees.
func TestHashIndexesBuiltBeforehandAreKept(t *testing.T) {
	t.Parallel()
	db, _ := migratedTo(t, 6)
	ctx := context.Background()
	q := pgx.Identifier{db.Schema}.Sanitize()
	db.Exec(t, `INSERT INTO `+q+`.processed_messages (scope, message_id, fingerprint, status, expires_at)
SELECT 'orders', 'evt_' || i, '\x00', 'done', now() + interval '1 day' FROM generate_series(1, 1000) i`)
	before := map[string]uint32{}
	for _, l := range idLookups {
		db.Exec(t, fmt.Sprintf("CREATE INDEX CONCURRENTLY %s ON %s.%s USING hash (%s)", l.index, q, l.table, l.column))
		before[l.index] = indexOID(ctx, t, db, l.index)
	}

	require.NoError(t, migrations.Apply(ctx, db.Pool, &migrations.Config{Schema: db.Schema}))
	requireLookupIndexes(t, db, "hash")
	for _, l := range idLookups {
		require.Equal(t, before[l.index], indexOID(ctx, t, db, l.index), "%s was built again", l.index)
	}
	require.Equal(t, 1, db.Count(t, "{schema}.processed_messages WHERE message_id = 'evt_500'"))
}

// migratedTo returns a fresh schema migrated to version, and a connection of its pool.
func migratedTo(t *testing.T, version int32) (*pgtest.DB, *pgx.Conn) {
	t.Helper()
	db := pgtest.New(t)
	ctx := context.Background()
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	t.Cleanup(conn.Release)
	require.NoError(t, migrations.MigrateTo(ctx, conn.Conn(), db.Schema, version))
	return db, conn.Conn()
}

// requireLookupIndexes checks that the lookups by id have the indexes of migration 0007
// (am "hash") or those before it ("btree"), and not the others.
func requireLookupIndexes(t *testing.T, db *pgtest.DB, am string) {
	t.Helper()
	ctx := context.Background()
	for _, l := range idLookups {
		hash, btree := indexMethod(ctx, t, db, l.index), indexMethod(ctx, t, db, l.table+"_"+l.column+"_idx")
		if am == "hash" {
			require.Equal(t, []string{"hash", ""}, []string{hash, btree}, "%s.%s: the hash index and the B-tree", l.table, l.column)
		} else {
			require.Equal(t, []string{"", "btree"}, []string{hash, btree}, "%s.%s: the hash index and the B-tree", l.table, l.column)
		}
	}
}

// explain returns the plan of sql with sequential scans priced out.
func explain(t *testing.T, db *pgtest.DB, sql string, args ...any) string {
	t.Helper()
	ctx := context.Background()
	var plan string
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL enable_seqscan = off"); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, "EXPLAIN "+sql, args...)
		if err != nil {
			return err
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		for _, l := range lines {
			plan += l + "\n"
		}
		return err
	})
	require.NoError(t, err)
	return plan
}

// indexMethod is the access method of the schema's index named name, "" when there is none.
func indexMethod(ctx context.Context, t *testing.T, db *pgtest.DB, name string) string {
	t.Helper()
	var am string
	err := db.Pool.QueryRow(ctx, `SELECT coalesce((SELECT a.amname FROM pg_class c JOIN pg_am a ON a.oid = c.relam
WHERE c.relkind = 'i' AND c.relname = $2 AND c.relnamespace = $1::regnamespace), '')`, pgx.Identifier{db.Schema}.Sanitize(), name).Scan(&am)
	require.NoError(t, err)
	return am
}

func indexOID(ctx context.Context, t *testing.T, db *pgtest.DB, name string) uint32 {
	t.Helper()
	var oid uint32
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT c.oid FROM pg_class c WHERE c.relname = $2 AND c.relnamespace = $1::regnamespace`,
		pgx.Identifier{db.Schema}.Sanitize(), name).Scan(&oid))
	return oid
}

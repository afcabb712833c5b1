package migrations_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestProcessedStaleMigration: migration 0010's columns reach every epoch's partition, the
// ones there already and the ones opened later, without rewriting any (a partition keeps
// its file), and read NULL on the records kept so far; the down migration drops them.
func TestProcessedStaleMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema, q, to := migrationTest(t)
	text := func(sql string, args ...any) string {
		var s string
		require.NoError(t, pool.QueryRow(ctx, sql, args...).Scan(&s))
		return s
	}
	exec := func(sql string) {
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	// What the pruner's OpenEpoch does, by hand.
	openEpoch := func(n string) {
		exec(`CREATE TABLE ` + q + `.processed_messages_e` + n + ` (LIKE ` + q + `.processed_messages INCLUDING ALL);
ALTER TABLE ` + q + `.processed_messages ATTACH PARTITION ` + q + `.processed_messages_e` + n + ` FOR VALUES FROM (` + n + `) TO (` + n + ` + 1);
INSERT INTO ` + q + `.processed_epochs (epoch) VALUES (` + n + `)`)
	}
	// The partitions' files, and the stale columns each partition has.
	files := func() string {
		return text(`SELECT string_agg(c.relname || '=' || c.relfilenode, ' ' ORDER BY c.relname) FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = '` + q + `.processed_messages'::regclass`)
	}
	columns := func() string {
		return text(`SELECT coalesce(string_agg(c.relname || '.' || a.attname || ':' || format_type(a.atttypid, a.atttypmod), ' ' ORDER BY c.relname, a.attnum), '')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_attribute a ON a.attrelid = c.oid
WHERE n.nspname = $1 AND c.relname LIKE 'processed_messages%' AND c.relkind IN ('r', 'p')
  AND a.attname LIKE 'stale%' AND NOT a.attisdropped`, schema)
	}

	to(9)
	openEpoch("1")
	exec(`INSERT INTO ` + q + `.processed_messages (scope, message_id, fingerprint, status, expires_at, epoch)
SELECT 's', 'm' || g, '\x00', 'done', now() + interval '1 day', g % 2 FROM generate_series(1, 100) g`)
	before := files()

	to(10)
	require.Equal(t, before, files(), "no partition rewritten")
	require.Equal(t, "processed_messages.stale_entity:text processed_messages.stale_version:numeric "+
		"processed_messages_e0.stale_entity:text processed_messages_e0.stale_version:numeric "+
		"processed_messages_e1.stale_entity:text processed_messages_e1.stale_version:numeric", columns())
	require.Equal(t, "100", text(`SELECT count(*)::text FROM `+q+`.processed_messages WHERE stale_entity IS NULL AND stale_version IS NULL`))
	openEpoch("2")
	exec(`INSERT INTO ` + q + `.processed_messages (scope, message_id, fingerprint, status, expires_at, stale_entity, stale_version)
VALUES ('s', 'late', '\x00', 'done', now() + interval '1 day', 'cus_1', 7)`)
	require.Equal(t, "2:cus_1:7", text(`SELECT epoch || ':' || stale_entity || ':' || stale_version FROM `+q+`.processed_messages WHERE message_id = 'late'`))

	to(9)
	require.Empty(t, columns(), "down: the columns dropped from every partition")
	require.Equal(t, "101", text(`SELECT count(*)::text FROM `+q+`.processed_messages`))
	openEpoch("3") // a partition made LIKE the table still attaches
	to(10)
	require.Contains(t, columns(), "processed_messages_e3.stale_version:numeric")
}

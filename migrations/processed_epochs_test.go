package migrations_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestProcessedEpochsMigration: migration 0009 makes the records kept so far epoch 0's
// partition, whole; a record written by hand goes to the current epoch; the down migration
// puts every epoch's records back in one table with the old primary key.
func TestProcessedEpochsMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _, q, to := migrationTest(t)
	text := func(sql string) string {
		var s string
		require.NoError(t, pool.QueryRow(ctx, sql).Scan(&s))
		return s
	}
	const columns = `scope, message_id, fingerprint, status, response_status, response_headers, response_body, received_at, completed_at, expires_at, lease_until, lease_token`
	digest := func() string {
		return text(`SELECT string_agg(concat_ws('|', ` + columns + `), ',' ORDER BY scope, message_id) FROM ` + q + `.processed_messages`)
	}

	to(8)
	_, err := pool.Exec(ctx, `INSERT INTO `+q+`.processed_messages (`+columns+`)
SELECT 's', 'm' || g, sha256(int8send(g)), CASE WHEN g % 5 = 0 THEN 'in_flight' ELSE 'done' END, 200, '{"a":"b"}', 'ok',
    now() - g * interval '1 minute', now(), now() + interval '7 days', CASE WHEN g % 5 = 0 THEN now() END, CASE WHEN g % 5 = 0 THEN gen_random_uuid() END
FROM generate_series(1, 50) g`)
	require.NoError(t, err)
	before := digest()

	to(9)
	require.Equal(t, before, digest(), "every record kept, whole")
	require.Equal(t, "0:50", text(`SELECT string_agg(epoch || ':' || n, ' ') FROM (SELECT epoch, count(*) n FROM `+q+`.processed_messages_e0 GROUP BY 1) c`))
	require.Equal(t, "r", text(`SELECT relkind::text FROM pg_class WHERE oid = '`+q+`.processed_messages_e0'::regclass`))
	require.Equal(t, "p", text(`SELECT relkind::text FROM pg_class WHERE oid = '`+q+`.processed_messages'::regclass`))
	// What the pruner's OpenEpoch does, by hand: a record then goes to epoch 1 by default.
	_, err = pool.Exec(ctx, `CREATE TABLE `+q+`.processed_messages_e1 (LIKE `+q+`.processed_messages INCLUDING ALL);
ALTER TABLE `+q+`.processed_messages ATTACH PARTITION `+q+`.processed_messages_e1 FOR VALUES FROM (1) TO (2);
INSERT INTO `+q+`.processed_epochs (epoch) VALUES (1);
INSERT INTO `+q+`.processed_messages (scope, message_id, fingerprint, status, expires_at) VALUES ('s', 'new', '\x00', 'done', now() + interval '1 day')`)
	require.NoError(t, err)
	require.Equal(t, "1", text(`SELECT epoch::text FROM `+q+`.processed_messages WHERE message_id = 'new'`))
	_, err = pool.Exec(ctx, `INSERT INTO `+q+`.processed_messages (scope, message_id, fingerprint, status, expires_at) VALUES ('s', 'new', '\x00', 'done', now())`)
	require.ErrorContains(t, err, "23505", "one id per epoch")

	to(8)
	require.Equal(t, "51", text(`SELECT count(*)::text FROM `+q+`.processed_messages`), "down: every epoch's records in one table")
	require.Equal(t, "r", text(`SELECT relkind::text FROM pg_class WHERE oid = '`+q+`.processed_messages'::regclass`))
	require.Equal(t, "processed_messages_pkey (scope, message_id)", text(`SELECT conname || ' (' || pg_get_indexdef(conindid, 1, true) || ', ' || pg_get_indexdef(conindid, 2, true) || ')' FROM pg_constraint WHERE conrelid = '`+q+`.processed_messages'::regclass AND contype = 'p'`))
	_, err = pool.Exec(ctx, `DELETE FROM `+q+`.processed_messages WHERE message_id = 'new'`)
	require.NoError(t, err)
	require.Equal(t, before, digest(), "down: whole")
	to(9)
	require.Equal(t, before, digest())
}

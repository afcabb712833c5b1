package migrations_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestOutboxPublishedMigration: migration 0008 moves the published rows kept in the outbox
// to outbox_published, whole and under their ids, leaves the rows still to publish where
// they are, and new rows get ids after both; its down migration puts every row back.
func TestOutboxPublishedMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema, q, to := migrationTest(t)
	count := func(from string) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+q+"."+from).Scan(&n))
		return n
	}
	// What every row holds, to compare before and after.
	const all = `SELECT string_agg(concat_ws('|', id, operation_id, pipeline, causation_id, topic, key, payload, headers, created_at, published_at), ',' ORDER BY id) FROM `
	digest := func(from string) string {
		var s string
		require.NoError(t, pool.QueryRow(ctx, all+"(SELECT * FROM "+q+"."+from+") r").Scan(&s))
		return s
	}

	to(7)
	_, err := pool.Exec(ctx, `INSERT INTO `+q+`.outbox (operation_id, pipeline, causation_id, topic, key, payload, headers, created_at, published_at)
SELECT gen_random_uuid(), 'p', 'm' || g, 't', CASE WHEN g % 3 = 0 THEN 'k'::bytea END, convert_to('{"n":' || g || '}', 'UTF8'),
    '{"content-type":"application/json"}', now() - g * interval '1 minute', CASE WHEN g <= 30 THEN now() - g * interval '1 second' END
FROM generate_series(1, 40) g`)
	require.NoError(t, err)
	before := digest("outbox")

	to(8)
	require.Equal(t, 10, count("outbox"), "the rows still to publish stay")
	require.Zero(t, count("outbox WHERE published_at IS NOT NULL"))
	require.Equal(t, 30, count("outbox_published"), "the published rows move")
	require.Equal(t, before, digest("outbox UNION ALL SELECT * FROM "+q+".outbox_published"), "whole, under their ids")
	var indexes []string
	rows, err := pool.Query(ctx, `SELECT indexname FROM pg_indexes WHERE schemaname = $1 AND tablename IN ('outbox', 'outbox_published') ORDER BY 1`, schema)
	require.NoError(t, err)
	indexes, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"outbox_pkey", "outbox_published_at_idx", "outbox_published_causation_id_idx",
		"outbox_published_operation_id_idx", "outbox_published_pkey"}, indexes, "the outbox keeps only its primary key")
	var id int64
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+q+`.outbox (operation_id, pipeline, causation_id, topic, payload)
VALUES (gen_random_uuid(), 'p', 'new', 't', '') RETURNING id`).Scan(&id))
	require.EqualValues(t, 41, id)
	_, err = pool.Exec(ctx, `DELETE FROM `+q+`.outbox WHERE id = $1`, id)
	require.NoError(t, err)

	to(7)
	require.Equal(t, before, digest("outbox"), "down: every row back in the outbox")
	to(8)
	require.Equal(t, 30, count("outbox_published"))
}

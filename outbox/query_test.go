package outbox_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/outbox"
)

// The console's and `idemd inspect`'s searches of the outbox by operation id or causation
// id are served by indexes where the rows can be many: the published rows kept with
// KeepPublished, in outbox_published (migration 0008), by its indexes on those ids. The
// rows still to publish are the whole outbox, which holds nothing else and which the
// doors' writes keep free of these indexes. The plan is read with sequential scans
// disabled, so a statement no index can serve shows a Seq Scan, or a walk of the whole
// primary key, however small the table.
func TestSearchByIDsUsesIndexes(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	store := outbox.New(&outbox.Config{Schema: db.Schema})
	ctx := context.Background()
	// 4,000 rows, the even ones published (kept).
	db.Exec(t, db.Q(`INSERT INTO {schema}.outbox (id, operation_id, pipeline, causation_id, topic, payload)
OVERRIDING SYSTEM VALUE
SELECT g, md5('op-' || g)::uuid, 'hooks', 'evt-' || g, 't', '{}' FROM generate_series(1, 4000, 2) g`))
	db.Exec(t, db.Q(`INSERT INTO {schema}.outbox_published (id, operation_id, pipeline, causation_id, topic, payload, created_at)
SELECT g, md5('op-' || g)::uuid, 'hooks', 'evt-' || g, 't', '{}', now() FROM generate_series(2, 4000, 2) g`))
	db.Exec(t, db.Q(`SELECT setval(pg_get_serial_sequence('{schema}.outbox', 'id'), 4000)`))
	db.Exec(t, db.Q(`ANALYZE {schema}.outbox, {schema}.outbox_published`))
	opID := func(g string) uuid.UUID {
		id, err := uuid.Parse(db.Text(t, "SELECT md5('op-' || $1::text)::uuid::text", g))
		require.NoError(t, err)
		return id
	}

	for _, f := range []outbox.RowFilter{
		{OperationID: opID("7")},
		{CausationID: "evt-8"},
		{CausationID: "evt-8", Topic: "t", AfterID: 100000},
		{CausationID: "evt-7", Unpublished: true},
		{CausationID: "evt-8", Published: true},
	} {
		sql, args := store.RowsSQL(f)
		plan := db.Plan(t, sql, args...)
		require.NotContains(t, plan, "Seq Scan on outbox_published", "filter %+v:\n%s", f, plan)
		// Not the whole table walked in id order either.
		require.NotContains(t, plan, "using outbox_published_pkey", "filter %+v:\n%s", f, plan)
		if !f.Unpublished {
			require.Contains(t, plan, "using outbox_published_", "filter %+v:\n%s", f, plan)
		} else {
			require.NotContains(t, plan, "outbox_published", "filter %+v:\n%s", f, plan)
		}
	}

	for g, published := range map[string]bool{"7": false, "8": true} {
		byOp, err := store.Rows(ctx, db.Pool, outbox.RowFilter{OperationID: opID(g)})
		require.NoError(t, err)
		require.Len(t, byOp, 1, "operation of evt-%s", g)
		require.Equal(t, "evt-"+g, byOp[0].CausationID)
		require.Equal(t, published, byOp[0].PublishedAt != nil)
		byCause, err := store.Rows(ctx, db.Pool, outbox.RowFilter{CausationID: "evt-" + g})
		require.NoError(t, err)
		require.Len(t, byCause, 1, "evt-%s", g)
		require.Equal(t, byOp[0].ID, byCause[0].ID)
		pending, err := store.Rows(ctx, db.Pool, outbox.RowFilter{CausationID: "evt-" + g, Unpublished: true})
		require.NoError(t, err)
		require.Len(t, pending, map[bool]int{false: 1, true: 0}[published], "evt-%s still to publish", g)
		done, err := store.Rows(ctx, db.Pool, outbox.RowFilter{CausationID: "evt-" + g, Published: true})
		require.NoError(t, err)
		require.Len(t, done, map[bool]int{false: 0, true: 1}[published], "evt-%s published", g)
	}
	// Both kinds at once, newest first, paged.
	db.Exec(t, db.Q(`INSERT INTO {schema}.outbox (operation_id, pipeline, causation_id, topic, payload, published_at)
VALUES (gen_random_uuid(), 'hooks', 'evt-8', 't', '{}', NULL)`))
	both, err := store.Rows(ctx, db.Pool, outbox.RowFilter{CausationID: "evt-8"})
	require.NoError(t, err)
	require.Len(t, both, 2)
	require.Nil(t, both[0].PublishedAt, "the newer row, still to publish, first")
	require.NotNil(t, both[1].PublishedAt)
	page, err := store.Rows(ctx, db.Pool, outbox.RowFilter{CausationID: "evt-8", AfterID: both[0].ID, Limit: 1})
	require.NoError(t, err)
	require.Len(t, page, 1)
	require.Equal(t, both[1].ID, page[0].ID)
}

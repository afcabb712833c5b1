package processed_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/processed"
)

// A search by message id (the console's and `idemd inspect`'s) is served by the primary
// key, one probe per scope: no index has message_id first since migration 0007, which
// dropped the one that cost every claim a random index write. The plan is read with
// sequential scans disabled, so a statement no index can serve shows a Seq Scan however
// small the table.
func TestSearchByMessageIDWalksThePrimaryKey(t *testing.T) {
	t.Parallel()
	b := setup(t, pgtest.Options{}, processed.Config{})
	ctx := context.Background()
	b.db.Exec(t, b.db.Q(`INSERT INTO {schema}.processed_messages (scope, message_id, fingerprint, status, expires_at)
SELECT s, 'm-' || g, '\xab', 'done', now() + interval '1 day'
FROM unnest(ARRAY['hooks', 'orders'||chr(31)||'acme', 'orders'||chr(31)||'globex', 'other']) s, generate_series(1, 2000) g`))
	b.db.Exec(t, b.db.Q(`ANALYZE {schema}.processed_messages`))

	for _, f := range []processed.RecordFilter{
		{MessageID: "m-17"},
		{MessageID: "m-17", Pipeline: "orders"},
		{MessageID: "m-17", Tenant: "globex", State: processed.StateDone},
	} {
		sql, args := b.store.ListRecordsSQL(f)
		plan := b.db.Plan(t, sql, args...)
		require.NotContains(t, plan, "Seq Scan", "filter %+v:\n%s", f, plan)
		// Each scope's record by its whole key, not the key walked for the id.
		require.Regexp(t, `Index Cond: \(\(scope = s\.scope\) AND \(message_id = `, plan, "filter %+v", f)
	}
	// A pipeline and a tenant are one scope: one probe, no walk (however many tenants).
	sql, args := b.store.ListRecordsSQL(processed.RecordFilter{MessageID: "m-17", Pipeline: "orders", Tenant: "acme"})
	plan := b.db.Plan(t, sql, args...)
	require.NotContains(t, plan, "Recursive", plan)
	require.Regexp(t, `Index Cond: \(\(scope = '[^']+'::text\) AND \(message_id = 'm-17'::text\)\)`, plan)

	all, err := b.store.ListRecords(ctx, b.db.Pool, processed.RecordFilter{MessageID: "m-17"})
	require.NoError(t, err)
	var scopes []string
	for _, r := range all {
		require.Equal(t, "m-17", r.MessageID)
		scopes = append(scopes, r.Scope)
	}
	require.ElementsMatch(t, []string{"hooks", "orders\x1facme", "orders\x1fglobex", "other"}, scopes, "one record per scope")
	orders, err := b.store.ListRecords(ctx, b.db.Pool, processed.RecordFilter{MessageID: "m-17", Pipeline: "orders"})
	require.NoError(t, err)
	require.Len(t, orders, 2)
	one, err := b.store.ListRecords(ctx, b.db.Pool, processed.RecordFilter{MessageID: "m-17", Pipeline: "orders", Tenant: "globex"})
	require.NoError(t, err)
	require.Len(t, one, 1)
	require.Equal(t, "orders\x1fglobex", one[0].Scope)
	none, err := b.store.ListRecords(ctx, b.db.Pool, processed.RecordFilter{MessageID: "m-2001"})
	require.NoError(t, err)
	require.Empty(t, none)
}

// The records of one listing are read through one list of destinations: each keeps its own
// values, and a NULL column reads as nil after a row that had one (and the other way round).
func TestListedRecordsKeepTheirOwnValues(t *testing.T) {
	t.Parallel()
	b := setup(t, pgtest.Options{}, processed.Config{})
	ctx := context.Background()
	b.db.Exec(t, b.db.Q(`INSERT INTO {schema}.processed_messages (scope, message_id, fingerprint, status, expires_at,
    response_status, response_headers, response_body, completed_at, lease_until)
VALUES ('s', 'a', '\x01', 'done', now() + interval '1 day', 201, '{"Location": "/a"}', 'body-a', now() - interval '1 hour', NULL),
       ('s', 'b', '\x02', 'in_flight', now() + interval '1 day', NULL, NULL, NULL, NULL, now() + interval '1 minute'),
       ('s', 'c', '\x03', 'done', now() + interval '1 day', 409, NULL, 'body-c', now(), NULL)`))
	got := map[string]*processed.Record{}
	for _, id := range []string{"a", "b", "c"} {
		rs, err := b.store.ListRecords(ctx, b.db.Pool, processed.RecordFilter{MessageID: id})
		require.NoError(t, err)
		require.Len(t, rs, 1)
		got[id] = rs[0]
	}
	all, err := b.store.ListRecords(ctx, b.db.Pool, processed.RecordFilter{Pipeline: "s"})
	require.NoError(t, err)
	require.Len(t, all, 3)
	for _, r := range all {
		require.Equal(t, got[r.MessageID], r, "record %s listed with the others", r.MessageID)
	}
	require.Equal(t, &processed.Response{Status: 201, Headers: map[string]string{"Location": "/a"}, Body: []byte("body-a")}, got["a"].Response)
	require.Nil(t, got["b"].Response)
	require.Nil(t, got["b"].CompletedAt)
	require.NotNil(t, got["b"].LeaseUntil)
	require.Equal(t, &processed.Response{Status: 409, Body: []byte("body-c")}, got["c"].Response)
	require.Equal(t, []byte{0x03}, got["c"].Fingerprint)
	require.Nil(t, got["c"].LeaseUntil)
}

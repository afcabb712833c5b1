package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/processed"
)

func TestPrunerOncePrunesOnlyWhatExpired(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	db.Exec(t, db.Q(`INSERT INTO {schema}.processed_messages (scope, message_id, fingerprint, status, expires_at)
SELECT 's', 'old-' || i, '\x00', 'done', now() - interval '1 second' FROM generate_series(1, 30) i`))
	db.Exec(t, db.Q(`INSERT INTO {schema}.processed_messages (scope, message_id, fingerprint, status, expires_at)
VALUES ('s', 'live', '\x00', 'done', now() + interval '1 day')`))
	db.Exec(t, db.Q(`INSERT INTO {schema}.outbox (operation_id, pipeline, causation_id, topic, payload)
SELECT gen_random_uuid(), 'p', 'm' || i, 't', '' FROM generate_series(1, 5) i`))
	db.Exec(t, db.Q(`INSERT INTO {schema}.outbox_published (id, operation_id, pipeline, causation_id, topic, payload, created_at, published_at)
SELECT 100 + i, gen_random_uuid(), 'p', 'k' || i, 't', '', now() - interval '3 days', now() - CASE WHEN i <= 10 THEN interval '2 days' ELSE interval '1 hour' END
FROM generate_series(1, 13) i`))

	p, err := newPruner(db.Pool, &prunerConfig{Schema: db.Schema, BatchSize: 7, OutboxRetention: 24 * time.Hour})
	require.NoError(t, err)
	records, rows := p.Once(context.Background())
	require.EqualValues(t, 30, records)
	require.EqualValues(t, 10, rows)
	require.Equal(t, 1, db.Count(t, "{schema}.processed_messages"))
	require.Equal(t, 5, db.Count(t, "{schema}.outbox"), "unpublished rows stay")
	require.Equal(t, 3, db.Count(t, "{schema}.outbox_published"), "published rows within the retention stay")
}

// With IDEMD_PROCESSED_PARTITION_INTERVAL the pruner opens an epoch when the current one
// is that old, drops an epoch whole once its records have expired, and deletes no record of
// like retention row by row: they stay until their epoch is dropped. With mixed retentions,
// an expired record its epoch would keep far longer is deleted row by row.
func TestPrunerWithPartitionsOpensAndDropsEpochs(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	db.Exec(t, db.Q(`INSERT INTO {schema}.processed_messages (scope, message_id, fingerprint, status, expires_at)
SELECT 's', 'old-' || i, '\x00', 'done', now() - interval '1 second' FROM generate_series(1, 30) i`))
	p, err := newPruner(db.Pool, &prunerConfig{Schema: db.Schema, PartitionInterval: time.Hour})
	require.NoError(t, err)
	records, _ := p.Once(context.Background())
	require.Zero(t, records, "epoch 0 is the current one, younger than an hour: kept whole")
	require.Equal(t, 30, db.Count(t, "{schema}.processed_messages"))

	db.Exec(t, db.Q(`UPDATE {schema}.processed_epochs SET opened_at = now() - interval '61 minutes'`))
	records, _ = p.Once(context.Background())
	require.EqualValues(t, 30, records, "epoch 1 opened, then epoch 0 dropped")
	require.Equal(t, "1", db.Text(t, db.Q(`SELECT string_agg(epoch::text, ' ') FROM {schema}.processed_epochs`)))
	require.Equal(t, 0, db.Count(t, "{schema}.processed_messages"))

	db.Exec(t, db.Q(`INSERT INTO {schema}.processed_messages (scope, message_id, fingerprint, status, expires_at)
VALUES ('s', 'expired', '\x00', 'done', now() - interval '1 second')`))
	records, _ = p.Once(context.Background())
	require.Zero(t, records)
	require.Equal(t, 1, db.Count(t, "{schema}.processed_messages WHERE epoch = 1"), "no row deleted in the current epoch")

	db.Exec(t, db.Q(`INSERT INTO {schema}.processed_messages (scope, message_id, fingerprint, status, expires_at)
VALUES ('s', 'kept a day', '\x00', 'done', now() + interval '1 day')`))
	records, _ = p.Once(context.Background())
	require.EqualValues(t, 1, records, "the expired record, which epoch 1 would keep a day longer")
	require.Equal(t, "kept a day", db.Text(t, db.Q(`SELECT string_agg(message_id, ' ') FROM {schema}.processed_messages`)))
}

// With IDEMD_PROCESSED_PARTITION_INTERVAL unset again, the pruner deletes expired records in
// every epoch left from when it was set, and drops those epochs once they are empty.
func TestPrunerWithoutPartitionsDropsEpochsLeftOver(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	db.Exec(t, db.Q(`INSERT INTO {schema}.processed_messages (scope, message_id, fingerprint, status, expires_at)
SELECT 's', 'old-' || i, '\x00', 'done', now() - interval '1 second' FROM generate_series(1, 5) i`))
	ps, err := processed.New(&processed.Config{Schema: db.Schema})
	require.NoError(t, err)
	_, err = ps.OpenEpoch(ctx, db.Pool, 0)
	require.NoError(t, err)
	db.Exec(t, db.Q(`INSERT INTO {schema}.processed_messages (scope, message_id, fingerprint, status, expires_at)
VALUES ('s', 'live', '\x00', 'done', now() + interval '1 day')`))

	p, err := newPruner(db.Pool, &prunerConfig{Schema: db.Schema})
	require.NoError(t, err)
	records, _ := p.Once(ctx)
	require.EqualValues(t, 5, records, "deleted row by row; the empty epoch then dropped")
	require.Equal(t, "1", db.Text(t, db.Q(`SELECT string_agg(epoch::text, ' ') FROM {schema}.processed_epochs`)))
	require.Equal(t, "live", db.Text(t, db.Q(`SELECT string_agg(message_id, ' ') FROM {schema}.processed_messages`)))
}

// Dead letters go after their retention, replayed ones sooner; the admin audit with them;
// entity versions after theirs. What is younger stays.
func TestOncePrunesDeadLettersAuditAndEntityVersions(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	letter := func(created, replayed string) {
		db.Exec(t, db.Q(`INSERT INTO {schema}.dead_letters (pipeline, door, scope, payload, reason, attempts, created_at, replayed_at)
VALUES ('p', 'http', 'p', '', 'r', 1, now() - $1::interval, now() - nullif($2, '')::interval)`), created, replayed)
	}
	letter("40 days", "")       // too old, never replayed: pruned
	letter("10 days", "")       // young, never replayed: kept
	letter("10 days", "8 days") // replayed long ago: pruned
	letter("3 days", "1 day")   // replayed recently: kept
	db.Exec(t, db.Q(`INSERT INTO {schema}.admin_audit (actor, action, target, outcome, at) VALUES
('a', 'x', '1', 'done', now() - interval '40 days'), ('a', 'x', '2', 'done', now())`))
	db.Exec(t, db.Q(`INSERT INTO {schema}.entity_versions (scope, entity, version, message_id, updated_at) VALUES
('s', 'old', 1, 'm1', now() - interval '31 days'), ('s', 'live', 1, 'm2', now() - interval '1 day')`))

	p, err := newPruner(db.Pool, &prunerConfig{Schema: db.Schema, BatchSize: 1})
	require.NoError(t, err)
	p.Once(context.Background())
	require.Equal(t, 2, db.Count(t, "{schema}.dead_letters"))
	require.Equal(t, 1, db.Count(t, "{schema}.dead_letters WHERE replayed_at IS NULL"))
	require.Equal(t, 1, db.Count(t, "{schema}.admin_audit"))
	require.Equal(t, 1, db.Count(t, "{schema}.entity_versions WHERE entity = 'live'"))
	require.Equal(t, 1, db.Count(t, "{schema}.entity_versions"))
}

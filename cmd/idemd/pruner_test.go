package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
)

func TestPrunerOncePrunesOnlyWhatExpired(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	db.Exec(t, db.Q(`INSERT INTO {schema}.processed_messages (scope, message_id, fingerprint, status, expires_at)
SELECT 's', 'old-' || i, '\x00', 'done', now() - interval '1 second' FROM generate_series(1, 30) i`))
	db.Exec(t, db.Q(`INSERT INTO {schema}.processed_messages (scope, message_id, fingerprint, status, expires_at)
VALUES ('s', 'live', '\x00', 'done', now() + interval '1 day')`))
	db.Exec(t, db.Q(`INSERT INTO {schema}.outbox (operation_id, pipeline, causation_id, topic, payload, published_at)
SELECT gen_random_uuid(), 'p', 'm' || i, 't', '', CASE WHEN i <= 10 THEN now() - interval '2 days' END
FROM generate_series(1, 15) i`))

	p, err := newPruner(db.Pool, &prunerConfig{Schema: db.Schema, BatchSize: 7, OutboxRetention: 24 * time.Hour})
	require.NoError(t, err)
	records, rows := p.Once(context.Background())
	require.EqualValues(t, 30, records)
	require.EqualValues(t, 10, rows)
	require.Equal(t, 1, db.Count(t, "{schema}.processed_messages"))
	require.Equal(t, 5, db.Count(t, "{schema}.outbox"), "unpublished rows stay")
}

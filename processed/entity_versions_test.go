package processed_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/processed"
)

// TestPruneEntityVersionsKeepsRecentOnes: pruning the stale-event guard's versions deletes
// only the entities no message updated for olderThan (SPEC 2.3b, 2.5: a message whose
// version is not newer than the last applied one is skipped); a version pruned too early
// would let an older event of its entity through. Pruning recent versions passed before:
// no test called PruneEntityVersions.
func TestPruneEntityVersionsKeepsRecentOnes(t *testing.T) {
	t.Parallel()
	b := setup(t, pgtest.Options{}, processed.Config{})
	ctx := context.Background()
	b.db.Exec(t, b.db.Q(`INSERT INTO {schema}.entity_versions (scope, entity, version, message_id, updated_at) VALUES
    ('s', 'recent', 7, 'm7', now() - interval '1 hour'),
    ('s', 'idle', 3, 'm3', now() - interval '3 days'),
    ('s', 'idle-too', 4, 'm4', now() - interval '2 days')`))

	n, err := b.store.PruneEntityVersions(ctx, b.db.Pool, 24*time.Hour, 1) // one row a statement
	require.NoError(t, err)
	require.Equal(t, int64(2), n)
	v, err := b.store.GetEntityVersion(ctx, b.db.Pool, "s", "recent")
	require.NoError(t, err)
	require.NotNil(t, v, "a version updated within olderThan is kept")
	require.Equal(t, "7", v.Version)
	require.Equal(t, "m7", v.MessageID)
	for _, entity := range []string{"idle", "idle-too"} {
		v, err := b.store.GetEntityVersion(ctx, b.db.Pool, "s", entity)
		require.NoError(t, err)
		require.Nil(t, v, entity)
	}
}

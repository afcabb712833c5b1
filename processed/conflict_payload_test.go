package processed_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/processed"
)

// A conflict keeps the conflicting payload, bounded, and lives for the retention of the
// record it conflicts with.
func TestConflictKeepsPayloadBoundedWithRecordRetention(t *testing.T) {
	t.Parallel()
	b := setup(t, pgtest.Options{}, processed.Config{})
	ctx := context.Background()
	claim := func(id string, fingerprint, payload []byte, retention time.Duration) processed.Result {
		var res []processed.Result
		require.NoError(t, b.inTx(t, func(tx pgx.Tx) error {
			var err error
			res, err = b.store.ClaimBatchTx(ctx, tx, []processed.Claim{{
				Scope: "s", MessageID: id, Fingerprint: fingerprint, Payload: payload, Retention: retention,
			}})
			return err
		}))
		return res[0]
	}
	require.Equal(t, processed.Claimed, claim("small", fp, []byte(`{"a":1}`), time.Hour).Outcome)
	require.Equal(t, processed.Claimed, claim("big", fp, []byte(`{}`), 48*time.Hour).Outcome)

	require.Equal(t, processed.Conflict, claim("small", []byte("fp-2"), []byte(`{"a":2}`), time.Hour).Outcome)
	big := bytes.Repeat([]byte("x"), processed.MaxConflictPayload+10)
	require.Equal(t, processed.Conflict, claim("big", []byte("fp-3"), big, 48*time.Hour).Outcome)
	// A second sighting keeps the first payload and counts.
	require.Equal(t, int64(2), claim("small", []byte("fp-2"), []byte(`{"a":"other bytes, same fingerprint"}`), time.Hour).ConflictCount)

	read := func(id string) (payload []byte, truncated bool, ttl time.Duration) {
		var expires time.Time
		var now time.Time
		require.NoError(t, b.db.Pool.QueryRow(ctx, b.db.Q(`SELECT payload, payload_truncated, expires_at, now()
			FROM {schema}.conflicts WHERE scope = 's' AND message_id = $1`), id).Scan(&payload, &truncated, &expires, &now))
		return payload, truncated, expires.Sub(now)
	}
	p, tr, ttl := read("small")
	require.Equal(t, `{"a":2}`, string(p))
	require.False(t, tr)
	require.InDelta(t, time.Hour.Seconds(), ttl.Seconds(), 60)
	p, tr, ttl = read("big")
	require.Len(t, p, processed.MaxConflictPayload)
	require.True(t, tr)
	require.InDelta(t, (48 * time.Hour).Seconds(), ttl.Seconds(), 60)

	// Expired conflicts go with the pruner; live ones stay.
	b.db.Exec(t, b.db.Q(`UPDATE {schema}.conflicts SET expires_at = now() - interval '1 second' WHERE message_id = 'small'`))
	_, err := b.store.Prune(ctx, b.db.Pool, 10)
	require.NoError(t, err)
	require.Equal(t, 0, b.db.Count(t, "{schema}.conflicts WHERE message_id = 'small'"))
	require.Equal(t, 1, b.db.Count(t, "{schema}.conflicts WHERE message_id = 'big'"))
}

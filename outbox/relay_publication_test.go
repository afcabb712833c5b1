package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/kafkatest"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/outbox"
)

// TestRelayPublication: by default a row leaves the outbox once the broker has it (one
// write per row); with KeepPublished it moves to outbox_published, with its published_at,
// for the console, and the outbox holds only what waits either way.
// Either way every row reaches Kafka once, and only rows Kafka acknowledged leave the
// unpublished set.
func TestRelayPublication(t *testing.T) {
	t.Parallel()
	for _, keep := range []bool{false, true} {
		t.Run(map[bool]string{false: "deleted", true: "kept"}[keep], func(t *testing.T) {
			t.Parallel()
			b := setupRelay(t, 2, pgtest.Options{})
			b.enqueue(t, b.events(60, "pub")...)
			relay, _ := b.startRelay(t, outbox.RelayConfig{BatchSize: 25, KeepPublished: keep})
			b.drain(t, relay, 30*time.Second)
			require.EqualValues(t, 60, relay.Published())
			require.Len(t, kafkatest.ReadAll(t, b.topic, 60, 30*time.Second), 60)

			rows, err := b.store.Rows(context.Background(), b.db.Pool, outbox.RowFilter{Limit: 100})
			require.NoError(t, err)
			if !keep {
				require.Empty(t, rows, "published rows are deleted")
				return
			}
			require.Len(t, rows, 60, "published rows are kept")
			for _, r := range rows {
				require.NotNil(t, r.PublishedAt, "row %d is marked published", r.ID)
			}
			require.Zero(t, b.db.Count(t, "{schema}.outbox"), "the outbox holds only what waits")
			require.Equal(t, 60, b.db.Count(t, "{schema}.outbox_published"))
		})
	}
}

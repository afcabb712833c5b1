package deadletter_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/internal/metricstest"
	"github.com/idemd/idemd/internal/pgtest"
)

// TestReplayerCountsCommittedReplays: a replay is counted once its transaction committed,
// by its door and outcome, and as the pipeline's processed or stale message; a replay that
// fails, rolls back at its commit, reports no outcome or is refused counts nothing.
func TestReplayerCountsCommittedReplays(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	// Deferred: a replay that inserts 'twice' twice fails only at its commit.
	db.Exec(t, db.Q(`CREATE TABLE {schema}.once (k text, CONSTRAINT once_k UNIQUE (k) DEFERRABLE INITIALLY DEFERRED)`))
	s := deadletter.New(db.Schema)
	ctx := context.Background()
	pipeline := pgtest.SchemaName(t) // a pipeline of its own: its metrics are its own
	write := func(door deadletter.Door, id string) int64 {
		var n int64
		require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			var err error
			n, err = s.WriteTx(ctx, tx, &deadletter.Letter{Pipeline: pipeline, Origin: deadletter.Origin{Door: door}, Scope: pipeline, MessageID: id, Reason: "x"})
			return err
		}))
		return n
	}
	boom := errors.New("still broken")
	rp := deadletter.NewReplayer(db.Pool, s)
	door := func(ctx context.Context, tx pgx.Tx, l *deadletter.Letter) (deadletter.Replayed, error) {
		switch l.MessageID {
		case "fails":
			return deadletter.Replayed{}, boom
		case "twice":
			_, err := tx.Exec(ctx, db.Q(`INSERT INTO {schema}.once VALUES ('twice'), ('twice')`))
			return deadletter.Replayed{Outcome: deadletter.ReplayApplied, Done: "inserted twice"}, err
		case "silent":
			return deadletter.Replayed{Done: "did something"}, nil
		}
		return deadletter.Replayed{Outcome: deadletter.ReplayOutcome(l.MessageID), Done: l.MessageID}, nil
	}
	rp.Register(deadletter.DoorKafka, pipeline, door)
	rp.Register(deadletter.DoorDelivery, "", door)

	type counts struct{ applied, stale, requeued, processed, staleMessages float64 }
	read := func() counts {
		return counts{
			applied:       counter(t, "idemd_dead_letters_replayed_total", pipeline, "door", "kafka", "outcome", "applied"),
			stale:         counter(t, "idemd_dead_letters_replayed_total", pipeline, "door", "kafka", "outcome", "stale"),
			requeued:      counter(t, "idemd_dead_letters_replayed_total", pipeline, "door", "delivery", "outcome", "requeued"),
			processed:     counter(t, "idemd_messages_processed_total", pipeline),
			staleMessages: counter(t, "idemd_messages_stale_total", pipeline),
		}
	}
	want := read()

	for _, tc := range []struct {
		door    deadletter.Door
		id      string
		counted func(*counts)
		fails   string // what the error of a replay that fails says
	}{
		{deadletter.DoorKafka, "applied", func(c *counts) { c.applied++; c.processed++ }, ""},
		{deadletter.DoorKafka, "stale", func(c *counts) { c.stale++; c.staleMessages++ }, ""},
		{deadletter.DoorDelivery, "requeued", func(c *counts) { c.requeued++ }, ""},
		{deadletter.DoorKafka, "fails", nil, boom.Error()},
		{deadletter.DoorKafka, "twice", nil, "once_k"}, // the door succeeded, the commit failed
		{deadletter.DoorKafka, "silent", nil, "no known outcome"},
		{deadletter.DoorRelay, "applied", nil, deadletter.ErrNoReplayer.Error()},
	} {
		id := write(tc.door, tc.id)
		_, err := rp.Replay(ctx, id)
		if tc.counted == nil {
			require.ErrorContains(t, err, tc.fails, tc.id)
			require.Equal(t, 1, db.Count(t, "{schema}.dead_letters WHERE id = $1 AND replayed_at IS NULL", id), "%s: nothing committed", tc.id)
			require.Equal(t, want, read(), "%s: nothing counted", tc.id)
			continue
		}
		require.NoError(t, err, tc.id)
		tc.counted(&want)
		require.Equal(t, want, read(), tc.id)
		_, err = rp.Replay(ctx, id)
		require.ErrorIs(t, err, deadletter.ErrAlreadyReplayed, tc.id)
		require.Equal(t, want, read(), "%s replayed again: refused, not counted", tc.id)
	}
}

// TestReplayerExpect: Expect creates the series a door's replays of a pipeline count in, at
// 0, before any replay, so that the first replays after a start show in rate().
func TestReplayerExpect(t *testing.T) {
	t.Parallel()
	pipeline := pgtest.SchemaName(t)
	rp := deadletter.NewReplayer(nil, deadletter.New(""))
	require.False(t, exists(t, "idemd_dead_letters_replayed_total", pipeline, "door", "sqs", "outcome", "applied"))
	rp.Expect(deadletter.DoorSQS, pipeline, deadletter.ReplayApplied, deadletter.ReplayStale)
	for _, s := range [][]string{
		{"idemd_dead_letters_replayed_total", pipeline, "door", "sqs", "outcome", "applied"},
		{"idemd_dead_letters_replayed_total", pipeline, "door", "sqs", "outcome", "stale"},
		{"idemd_messages_processed_total", pipeline},
		{"idemd_messages_stale_total", pipeline},
	} {
		require.True(t, exists(t, s[0], s[1], s[2:]...), "%v", s)
		require.Zero(t, counter(t, s[0], s[1], s[2:]...), "%v", s)
	}
	require.False(t, exists(t, "idemd_dead_letters_replayed_total", pipeline, "door", "sqs", "outcome", "requeued"), "only the outcomes named")
}

// series reads the series of name of pipeline with the other labels given as name, value
// pairs: its value, and whether it exists (reading it does not create it).
func series(t *testing.T, name, pipeline string, labels ...string) (float64, bool) {
	t.Helper()
	want := map[string]string{"pipeline": pipeline}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
	v, n := metricstest.Sum(t, name, want)
	return v, n > 0
}

func counter(t *testing.T, name, pipeline string, labels ...string) float64 {
	v, _ := series(t, name, pipeline, labels...)
	return v
}

func exists(t *testing.T, name, pipeline string, labels ...string) bool {
	_, ok := series(t, name, pipeline, labels...)
	return ok
}

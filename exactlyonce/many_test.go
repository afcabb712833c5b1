package exactlyonce_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/exactlyonce"
	"github.com/idemd/idemd/internal/effectsql"
)

// Effects with a multi-message form (Effect.Many) run as one statement per run of
// consecutive messages, with the same result as one statement per message: rows in message
// order, a poison message dead-lettered alone (the batch falls back to savepoints), and
// other statements (an answer's, another pipeline's, a letter) in between kept in order.
func TestManyEffects(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.db.Exec(t, b.db.Q("CREATE TABLE {schema}.rows (seq bigint GENERATED ALWAYS AS IDENTITY, id text PRIMARY KEY, n int NOT NULL CHECK (n >= 0))"))
	conn, err := b.db.Pool.Acquire(context.Background())
	require.NoError(t, err)
	st, err := effectsql.Prepare(context.Background(), conn.Conn(), b.db.Q("INSERT INTO {schema}.rows (id, n) VALUES (@message_id, @partition)"))
	conn.Release()
	require.NoError(t, err)
	require.NotEmpty(t, st.Many)

	msg := func(id string, n int) *exactlyonce.Message {
		return &exactlyonce.Message{Scope: "s", ID: id, Fingerprint: []byte("fp"), MaxAttempts: 2,
			Effect: exactlyonce.Effect{SQL: st.SQL, Many: st.Many, Args: st.Bind(&effectsql.Values{MessageID: id, Position: effectsql.Position{Topic: "t", Partition: n}})},
			Letter: &deadletter.Letter{Pipeline: "s", Origin: deadletter.Origin{Door: deadletter.DoorKafka}, Scope: "s", MessageID: id}}
	}
	var batch []*exactlyonce.Message
	var want []string
	for i := range 30 {
		id := fmt.Sprintf("m-%02d", i)
		switch i {
		case 10: // answered: its SQL runs alone, at its place
			m := b.msg(id, i)
			batch = append(batch, m)
			continue
		case 20:
			m := msg(id, 0)
			m.Invalid = fmt.Errorf("no usable id") // a letter between two runs
			batch = append(batch, m)
			continue
		}
		batch = append(batch, msg(id, i))
		want = append(want, id)
	}
	require.NoError(t, b.unit.Apply(context.Background(), batch))
	for _, m := range batch {
		switch m.ID {
		case "m-10":
			require.Equal(t, exactlyonce.Applied, m.Outcome)
		case "m-20":
			require.Equal(t, exactlyonce.DeadLettered, m.Outcome)
		default:
			require.Equal(t, exactlyonce.Applied, m.Outcome, m.ID)
		}
	}
	var got []string
	rows, err := b.db.Pool.Query(context.Background(), b.db.Q("SELECT id FROM {schema}.rows ORDER BY seq"))
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		got = append(got, id)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, want, got, "rows in message order")
	require.Equal(t, 1, b.db.Count(t, "{schema}.effects WHERE id = 'm-10'"))

	// A poison message inside a run: the run's statement fails, the batch runs again with
	// savepoints, and only the poison one is dead-lettered.
	var second []*exactlyonce.Message
	for i := range 20 {
		n := i
		if i == 7 {
			n = -1
		}
		second = append(second, msg(fmt.Sprintf("p-%02d", i), n))
	}
	require.NoError(t, b.unit.Apply(context.Background(), second))
	for i, m := range second {
		if i == 7 {
			require.Equal(t, exactlyonce.DeadLettered, m.Outcome)
			require.Equal(t, 2, m.Attempts)
			continue
		}
		require.Equal(t, exactlyonce.Applied, m.Outcome, m.ID)
	}
	require.Equal(t, 19, b.db.Count(t, "{schema}.rows WHERE id LIKE 'p-%'"))
	require.Equal(t, 1, b.db.Count(t, "{schema}.dead_letters WHERE message_id = 'p-07' AND attempts = 2"))
}

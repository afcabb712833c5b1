package exactlyonce_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/exactlyonce"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/processed"
)

type bundle struct {
	db   *pgtest.DB
	unit *exactlyonce.Unit
}

func setup(t *testing.T) *bundle {
	t.Helper()
	db := pgtest.New(t)
	store, err := processed.New(&processed.Config{Schema: db.Schema})
	require.NoError(t, err)
	l := logrus.New()
	l.SetLevel(logrus.ErrorLevel)
	unit, err := exactlyonce.New(db.Pool, &exactlyonce.Config{Processed: store, BackoffMin: time.Millisecond, BackoffMax: 10 * time.Millisecond, Logger: logrus.NewEntry(l)})
	require.NoError(t, err)
	db.Exec(t, db.Q("CREATE TABLE {schema}.effects (id text PRIMARY KEY, n int NOT NULL CHECK (n >= 0))"))
	return &bundle{db: db, unit: unit}
}

// insert is an effect that inserts (id, n); a negative n violates the CHECK constraint,
// a permanent failure.
func (b *bundle) insert(n int) exactlyonce.Effect {
	return func(ctx context.Context, tx pgx.Tx, m *exactlyonce.Message) (*processed.Response, error) {
		_, err := tx.Exec(ctx, b.db.Q("INSERT INTO {schema}.effects VALUES ($1, $2)"), m.ID, n)
		return &processed.Response{Status: 200, Body: []byte(m.ID)}, err
	}
}

func msg(id string, effect exactlyonce.Effect) *exactlyonce.Message {
	return &exactlyonce.Message{Scope: "s", ID: id, Fingerprint: []byte("fp"), Effect: effect, StoreResponse: true}
}

func TestPoisonMessageDoesNotFailNeighbours(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var deadLettered atomic.Int32
	var batch []*exactlyonce.Message
	for i := 0; i < 100; i++ {
		batch = append(batch, msg(fmt.Sprintf("good-%d", i), b.insert(i)))
	}
	poison := msg("poison", b.insert(-1))
	poison.MaxAttempts = 3
	poison.DeadLetter = func(ctx context.Context, tx pgx.Tx, m *exactlyonce.Message, cause error) (*processed.Response, error) {
		deadLettered.Add(1)
		require.ErrorContains(t, cause, "23514")
		return &processed.Response{Status: 202, Body: []byte("dead")}, nil
	}
	batch = append(batch[:50], append([]*exactlyonce.Message{poison}, batch[50:]...)...)

	require.NoError(t, b.unit.Apply(context.Background(), batch))
	require.Equal(t, 100, b.db.Count(t, "{schema}.effects"))
	require.Equal(t, exactlyonce.DeadLettered, poison.Outcome)
	require.Equal(t, 3, poison.Attempts)
	require.EqualValues(t, 1, deadLettered.Load())
	require.Equal(t, 1, b.db.Count(t, "{schema}.processed_messages WHERE status = 'dead'"))
	require.Equal(t, 100, b.db.Count(t, "{schema}.processed_messages WHERE status = 'done'"))

	// Redelivered, the whole batch is duplicates, the poison one included, with stored responses.
	require.NoError(t, b.unit.Apply(context.Background(), batch))
	for _, m := range batch {
		require.Equal(t, exactlyonce.Duplicate, m.Outcome, m.ID)
	}
	require.Equal(t, "dead", string(poison.Response.Body))
	require.EqualValues(t, 1, deadLettered.Load())
}

func TestTransientFailureRetriesWholeBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls atomic.Int32
	flaky := func(ctx context.Context, tx pgx.Tx, m *exactlyonce.Message) (*processed.Response, error) {
		if calls.Add(1) <= 2 {
			return nil, &pgconn.PgError{Code: "40001", Message: "could not serialize access"}
		}
		return b.insert(1)(ctx, tx, m)
	}
	batch := []*exactlyonce.Message{msg("a", b.insert(1)), msg("b", flaky)}
	require.NoError(t, b.unit.Apply(context.Background(), batch))
	require.Equal(t, 2, b.db.Count(t, "{schema}.effects"))
	require.Equal(t, exactlyonce.Applied, batch[0].Outcome)
	require.Equal(t, exactlyonce.Applied, batch[1].Outcome)
	require.EqualValues(t, 3, calls.Load())
}

func TestRepeatsInsideOneBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first := msg("x", b.insert(1))
	repeat := msg("x", b.insert(1))
	conflict := msg("x", b.insert(1))
	conflict.Fingerprint = []byte("other")
	require.NoError(t, b.unit.Apply(context.Background(), []*exactlyonce.Message{first, repeat, conflict}))
	require.Equal(t, exactlyonce.Applied, first.Outcome)
	require.Equal(t, exactlyonce.Duplicate, repeat.Outcome)
	require.Equal(t, "x", string(repeat.Response.Body), "a repeat answers like its first occurrence")
	require.Equal(t, exactlyonce.Conflict, conflict.Outcome)
	require.Equal(t, 1, b.db.Count(t, "{schema}.effects"))
	require.Equal(t, 1, b.db.Count(t, "{schema}.conflicts"))
}

func TestApplyStopsWithContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	forever := func(ctx context.Context, tx pgx.Tx, m *exactlyonce.Message) (*processed.Response, error) {
		return nil, errors.New("downstream unavailable") // not marked permanent: retried, never skipped
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err := b.unit.Apply(ctx, []*exactlyonce.Message{msg("a", forever)})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Zero(t, b.db.Count(t, "{schema}.processed_messages"), "nothing is marked for a message that never succeeded")
}

// TestDeferredConstraintBlamesItsMessage: an effect table with a deferred constraint. The
// violation is checked at the statement (SET CONSTRAINTS ALL IMMEDIATE), inside the poison
// message's savepoint, so its neighbours commit and it alone is dead-lettered; without it
// the violation would surface at COMMIT, where no message can be blamed.
func TestDeferredConstraintBlamesItsMessage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.db.Exec(t, b.db.Q("CREATE TABLE {schema}.deferred (k text, CONSTRAINT deferred_k UNIQUE (k) DEFERRABLE INITIALLY DEFERRED)"))
	b.db.Exec(t, b.db.Q("INSERT INTO {schema}.deferred VALUES ('taken')"))
	insert := func(k string) exactlyonce.Effect {
		return func(ctx context.Context, tx pgx.Tx, m *exactlyonce.Message) (*processed.Response, error) {
			_, err := tx.Exec(ctx, b.db.Q("INSERT INTO {schema}.deferred VALUES ($1)"), k)
			return nil, err
		}
	}
	var dead atomic.Int32
	poison := msg("poison", insert("taken"))
	poison.DeadLetter = func(ctx context.Context, tx pgx.Tx, m *exactlyonce.Message, cause error) (*processed.Response, error) {
		dead.Add(1)
		return nil, nil
	}
	batch := []*exactlyonce.Message{msg("a", insert("a")), poison, msg("b", insert("b"))}
	require.NoError(t, b.unit.Apply(context.Background(), batch))
	require.Equal(t, exactlyonce.Applied, batch[0].Outcome)
	require.Equal(t, exactlyonce.DeadLettered, poison.Outcome)
	require.Equal(t, exactlyonce.Applied, batch[2].Outcome)
	require.EqualValues(t, 1, dead.Load())
	require.Equal(t, 3, b.db.Count(t, "{schema}.deferred"))
}

package exactlyonce_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/exactlyonce"
	"github.com/idemd/idemd/outbox"
	"github.com/idemd/idemd/processed"
)

// Answers built by the unit, in one batch: a StatusColumn row and a BusinessError are stored
// as the answer, with the effect's writes and without the events; NoRows answers an effect
// that affected nothing; a BusinessError where no answer can be given (no Answer) is a
// permanent failure.
func TestBusinessAnswers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	event := []exactlyonce.Event{{Event: outbox.Event{Topic: "t", Pipeline: "s", CausationID: "x"}, FromResult: true}}

	declined := b.msg("declined", 1)
	declined.Effect.SQL = b.db.Q(`WITH i AS (INSERT INTO {schema}.effects VALUES ($1, $2) RETURNING id) SELECT 402 AS http_status, id, 'card_declined' AS error FROM i`)
	declined.Events = event

	goDeclined := b.msg("go-declined", 2)
	goDeclined.Effect.Func = func(context.Context, pgx.Tx) (any, error) {
		return nil, &exactlyonce.BusinessError{Status: 409, Body: []byte(`{"error":"taken"}`)}
	}
	goDeclined.Events = event

	none := b.msg("none", 0)
	none.Effect.SQL = b.db.Q(`DELETE FROM {schema}.effects WHERE id = $1 AND $2 = 0`)
	none.Answer.Status = 204
	none.Answer.NoRows = &processed.Response{Status: 404, Body: []byte("gone")}

	deleted := b.msg("deleted", 0)
	deleted.Effect.SQL = b.db.Q(`DELETE FROM {schema}.effects WHERE id = 'declined' AND $1 <> '' AND $2 = 0`)
	deleted.Answer.Status = 204
	deleted.Answer.NoRows = none.Answer.NoRows

	noAnswer := b.msg("no-answer", 3)
	noAnswer.Answer = nil
	noAnswer.Effect.Func = goDeclined.Effect.Func
	noAnswer.Letter = &deadletter.Letter{Pipeline: "s", Origin: deadletter.Origin{Door: deadletter.DoorKafka}, Scope: "s", MessageID: "no-answer"}

	// "deleted" runs after "declined" in the same transaction, and sees its row.
	msgs := []*exactlyonce.Message{declined, goDeclined, none, deleted, noAnswer}
	require.NoError(t, b.unit.Apply(context.Background(), msgs))

	require.Equal(t, exactlyonce.Applied, declined.Outcome)
	require.Equal(t, 402, declined.Response.Status)
	require.Equal(t, `{"error":"card_declined","id":"declined"}`, string(declined.Response.Body))
	require.Equal(t, exactlyonce.Applied, goDeclined.Outcome)
	require.Equal(t, 409, goDeclined.Response.Status)
	require.Equal(t, `{"error":"taken"}`, string(goDeclined.Response.Body))
	require.Equal(t, 0, b.db.Count(t, "{schema}.outbox"), "business errors publish nothing")
	require.Equal(t, 404, none.Response.Status)
	require.Equal(t, 204, deleted.Response.Status)
	require.Empty(t, deleted.Response.Body)
	require.Equal(t, exactlyonce.DeadLettered, noAnswer.Outcome)
	require.Equal(t, 1, b.db.Count(t, "{schema}.effects WHERE id = 'go-declined'"), "the writes of an effect that answered commit")

	// Stored: a second delivery is answered from the record.
	again := b.msg("declined", 1)
	again.Effect = declined.Effect
	require.NoError(t, b.unit.Apply(context.Background(), []*exactlyonce.Message{again}))
	require.Equal(t, exactlyonce.Duplicate, again.Outcome)
	require.Equal(t, declined.Response.Body, again.Response.Body)
	require.Equal(t, 402, again.Response.Status)
}

// TestStatusColumnOutsideHTTPStatusesFails: a StatusColumn value is an answer's status only
// from 200 to 599 (SPEC 2.3b: an integer column http_status is the answer's status); 600 is
// a permanent failure, answered as one (Answer.Failed), never sent as a status. Widening the
// range passed before: the only out-of-range value tested was 99, below it.
func TestStatusColumnOutsideHTTPStatusesFails(t *testing.T) {
	t.Parallel()
	b := setup(t)
	last := b.msg("last-status", 1)
	last.Effect.SQL = b.db.Q(`SELECT 599 AS http_status, $1::text AS id, $2::int AS n`)
	over := b.msg("over-status", 2)
	over.Effect.SQL = b.db.Q(`SELECT 600 AS http_status, $1::text AS id, $2::int AS n`)
	require.NoError(t, b.unit.Apply(context.Background(), []*exactlyonce.Message{last, over}))
	require.Equal(t, 599, last.Response.Status)
	require.Equal(t, 422, over.Response.Status, "http_status 600 was taken as the answer's status")
	require.Equal(t, "dead", string(over.Response.Body))
}

// TestStatusColumnIsDataWithoutAnAnswer: only a message that is answered (an API request)
// reads a StatusColumn as its answer's status. For a webhook or a subscription's message
// (no Answer) the column is data like any other: the effect is applied, its events are
// published, and the column stays in the result they carry. Reading it as an answer there
// too, so that a 402 row silently published nothing, passed before.
func TestStatusColumnIsDataWithoutAnAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m := b.msg("webhook", 1)
	m.Answer = nil
	m.Effect.SQL = b.db.Q(`SELECT 402 AS http_status, $1::text AS id, $2::int AS n`)
	m.Events = []exactlyonce.Event{{Event: outbox.Event{Topic: "t", Pipeline: "s", CausationID: "webhook"}, FromResult: true}}
	require.NoError(t, b.unit.Apply(context.Background(), []*exactlyonce.Message{m}))
	require.Equal(t, exactlyonce.Applied, m.Outcome)
	require.Nil(t, m.Response)
	require.Equal(t, 1, b.db.Count(t, "{schema}.outbox"), "the event of an unanswered message is published")
	require.Equal(t, 1, b.db.Count(t, `{schema}.outbox WHERE convert_from(payload, 'UTF8')::jsonb = '{"http_status": 402, "id": "webhook", "n": 1}'::jsonb`))
}

package outbox

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
)

// The relay's statements run with sequential and bitmap scans off, and only they: the
// settings do not stay on the pooled connection for whoever uses it next.
func TestByIndexIsLocalToTheStatement(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, 1)
	ctx := context.Background()
	const settings = "SELECT current_setting('enable_seqscan') || current_setting('enable_bitmapscan')"
	rows, done, err := queryByIndex(ctx, pool, settings)
	require.NoError(t, err)
	require.True(t, rows.Next())
	var during string
	require.NoError(t, rows.Scan(&during))
	rows.Close()
	require.NoError(t, rows.Err())
	require.NoError(t, done())
	require.Equal(t, "offoff", during)
	after := func() string {
		var s string
		require.NoError(t, pool.QueryRow(ctx, settings).Scan(&s))
		return s
	}
	require.Equal(t, "onon", after(), "the same (only) connection, next statement")

	require.NoError(t, execByIndex(ctx, pool, "SELECT 1 WHERE "+settings[len("SELECT "):]+" = 'offoff'"))
	require.Equal(t, "onon", after())
}

// TestRelayStatementsUseThePrimaryKey: on an outbox whose statistics say it is empty (as
// after a quiet spell) but which holds thousands of dead rows and some live ones, every
// statement of the relay that finds rows by id plans a walk of the primary key under
// byIndex, never a sequential or bitmap scan that would visit every dead row.
func TestRelayStatementsUseThePrimaryKey(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	db.Exec(t, db.Q(`ANALYZE {schema}.outbox`))
	db.Exec(t, db.Q(`INSERT INTO {schema}.outbox (operation_id, pipeline, causation_id, topic, payload)
SELECT gen_random_uuid(), 'p', 'c' || g, 't', '' FROM generate_series(1, 5000) g`))
	db.Exec(t, db.Q(`DELETE FROM {schema}.outbox WHERE id <= 4900`))
	for _, keep := range []bool{false, true} {
		r, err := NewRelay(db.Pool, &RelayConfig{Schema: db.Schema, Brokers: []string{"127.0.0.1:1"}, KeepPublished: keep})
		require.NoError(t, err)
		stmts := map[string][]any{
			"select":       {r.selectSQL, 100, []string{}, int64(0)},
			"select floor": {r.selectSQL, 100, []string{}, int64(4901)},
			"select after": {r.selectAfterSQL, 100, int64(4900)},
			"older":        {r.olderSQL, int64(4950), []int64{4940}, int64(0)},
			"older gaps":   {r.olderGapsSQL, int64(4950), []int64{4945}, int64(4901)},
			"take older":   {r.takeOlderSQL, []int64{4903, 4945}},
			"lowest":       {r.lowestSQL, int64(0), int64(4999)},
			"stats":        {r.statsSQL, int64(4901)},
		}
		for name, s := range map[string]byIDs{"take": r.take, "mark": r.markIDs} {
			for _, ids := range [][]int64{{4901, 4902, 4903}, {4901, 4950, 4999}} {
				sql, args := s.forIDs(ids)
				stmts[fmt.Sprintf("%s %v", name, ids)] = append([]any{sql}, args...)
			}
		}
		for name, st := range stmts {
			tx, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, byIndex)
			require.NoError(t, err)
			rows, err := tx.Query(ctx, "EXPLAIN "+st[0].(string), st[1:]...)
			require.NoError(t, err)
			lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			require.NoError(t, tx.Rollback(ctx))
			plan := strings.Join(lines, "\n")
			require.NotContains(t, plan, "Seq Scan on outbox ", "keep=%v %s:\n%s", keep, name, plan)
			require.NotContains(t, plan, "Bitmap", "keep=%v %s:\n%s", keep, name, plan)
			require.Contains(t, plan, "using outbox_pkey", "keep=%v %s:\n%s", keep, name, plan)
		}
	}
}

// TestRecordHeaders: an event's Kafka headers are operation-id (as uuid.UUID.String writes
// it), causation-id and idemd-pipeline, which win over the event's own of those names, then
// the event's others; several events share the round's two buffers without overlapping.
func TestRecordHeaders(t *testing.T) {
	events := []Event{
		{OperationID: uuid.New(), CausationID: "evt_1", Pipeline: "orders",
			Headers: map[string]string{"content-type": "application/json", HeaderOperationID: "spoofed", "x": ""}},
		{OperationID: uuid.MustParse("00112233-4455-6677-8899-aabbccddeeff"), CausationID: "evt_2", Pipeline: "p"},
	}
	var nh, nb int
	for i := range events {
		n, b := headersSize(&events[i])
		nh, nb = nh+n, nb+b
	}
	hs, vals := make([]kafka.Header, 0, nh), make([]byte, 0, nb)
	var per [][]kafka.Header
	for _, e := range events {
		start := len(hs)
		hs, vals = recordHeaders(hs, vals, e.OperationID, e.CausationID, e.Pipeline, e.Headers)
		per = append(per, hs[start:])
	}
	for i, e := range events {
		got := map[string]string{}
		for _, h := range per[i] {
			got[h.Key] = string(h.Value)
		}
		want := map[string]string{HeaderOperationID: e.OperationID.String(), HeaderCausationID: e.CausationID, HeaderPipeline: e.Pipeline}
		for k, v := range e.Headers {
			if _, ours := want[k]; !ours {
				want[k] = v
			}
		}
		require.Equal(t, want, got, "event %d", i)
	}
	require.Equal(t, "00112233-4455-6677-8899-aabbccddeeff", string(per[1][0].Value))
	require.LessOrEqual(t, len(vals), nb, "sized by headersSize")
}

// TestJSONOnlyHeadersShared: the headers column of a row with only a JSON content type,
// read as the relay reads it, decodes to the one shared map, which stays as it is.
func TestJSONOnlyHeadersShared(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, 1)
	var b []byte
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT $1::jsonb`, `{"content-type":"application/json"}`).Scan(&b))
	m, err := decodeHeaders(b)
	require.NoError(t, err)
	require.Equal(t, reflect.ValueOf(jsonOnly).UnsafePointer(), reflect.ValueOf(m).UnsafePointer(), "%s", b)
	require.Equal(t, map[string]string{"content-type": "application/json"}, jsonOnly)
}

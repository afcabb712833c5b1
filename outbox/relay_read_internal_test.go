package outbox

import (
	"context"
	"reflect"
	"testing"

	"github.com/google/uuid"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
)

// The relay's select runs with bitmap scans off, and only it: the setting does not stay on
// the pooled connection for whoever uses it next.
func TestQueryNoBitmapIsLocalToTheStatement(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, 1)
	ctx := context.Background()
	rows, done, err := queryNoBitmap(ctx, pool, "SELECT current_setting('enable_bitmapscan')")
	require.NoError(t, err)
	require.True(t, rows.Next())
	var during string
	require.NoError(t, rows.Scan(&during))
	rows.Close()
	require.NoError(t, rows.Err())
	require.NoError(t, done())
	require.Equal(t, "off", during)

	var after string
	require.NoError(t, pool.QueryRow(ctx, "SELECT current_setting('enable_bitmapscan')").Scan(&after))
	require.Equal(t, "on", after, "the same (only) connection, next statement")
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

package exactlyonce_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/exactlyonce"
	"github.com/idemd/idemd/internal/effectsql"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/outbox"
)

// BenchmarkApply applies batches of 500 messages (every fifth a redelivery of the previous
// batch's) with the consumer's kind of effect (one row per message, the payload cast to
// jsonb) and one outbox event each, on one connection, and reports the CPU time the
// PostgreSQL backend spent per message (read from /proc: the server is local), and the
// client's allocations. "one-by-one" runs the effect as a statement per message, "many" as
// one statement per batch (Effect.Many). "limit" is the baseline: the same writes as one
// statement per batch, the dedup insert, the effect and the outbox row of each new id in
// one data-modifying CTE over unnest arrays, as idemd-bench's limit does them; idemd's
// statements (claim, lookup of the repeats, effect, outbox) against it are PostgreSQL's
// price of idemd's unit of work (BENCHMARKS.md, phase 29).
func BenchmarkApply(b *testing.B) {
	db := pgtest.NewWithOptions(b, pgtest.Options{MaxConns: 1})
	db.Exec(b, db.Q(`CREATE TABLE {schema}.fx (message_id text NOT NULL, payload jsonb, topic text, part int, off bigint)`))
	conn, err := db.Pool.Acquire(context.Background())
	require.NoError(b, err)
	st, err := effectsql.Prepare(context.Background(), conn.Conn(), db.Q(`INSERT INTO {schema}.fx (message_id, payload, topic, part, off)
VALUES (@message_id, @payload::jsonb, @topic, @partition, @offset)`))
	conn.Release()
	require.NoError(b, err)
	unit := newUnit(b, db, db.Pool, nil)
	const size = 500
	run := 0
	for _, mode := range []string{"one-by-one", "many", "limit"} {
		many := mode != "one-by-one"
		b.Run(mode, func(b *testing.B) {
			run++
			pid := backendPID(b, db.Pool)
			cpu0 := procCPU(b, pid)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if mode == "limit" {
					limitBatch(b, db, run, i, size)
					continue
				}
				msgs := make([]*exactlyonce.Message, size)
				for j := range msgs {
					id, payload := applyBenchMessage(run, i, j)
					e := exactlyonce.Effect{SQL: st.SQL, Args: st.Bind(&effectsql.Values{MessageID: id, Payload: payload, Source: "bench",
						Position: effectsql.Position{Topic: "in", Partition: 0, Offset: int64(i*size + j)}, ReceivedAt: time.Now()})}
					if many {
						e.Many = st.Many
					}
					msgs[j] = &exactlyonce.Message{Scope: "bench", ID: id, Fingerprint: []byte("fp"), Payload: payload, Effect: e,
						Events: []exactlyonce.Event{{Event: outbox.Event{Topic: "out", Pipeline: "bench", CausationID: id, Payload: payload,
							OperationID: outbox.OperationID("bench", id, 0), Headers: map[string]string{"content-type": "application/json"}}}}}
				}
				if err := unit.Apply(context.Background(), msgs); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64((procCPU(b, pid)-cpu0).Microseconds())/float64(b.N*size), "pg-µs/msg")
		})
	}
}

// applyBenchMessage is BenchmarkApply's message j of batch i: every fifth a redelivery of
// the previous batch's, its id spread over the key space as real event ids are.
func applyBenchMessage(run, i, j int) (string, []byte) {
	n := i
	if j%5 == 4 && i > 0 {
		n = i - 1
	}
	h := fnv.New64a()
	fmt.Fprintf(h, "%d-%d-%d", run, n, j)
	id := fmt.Sprintf("evt_%016x%08x", h.Sum64(), j)
	return id, fmt.Appendf(nil, `{"id":%q,"object":"event","type":"payment_intent.succeeded","data":{"object":{"id":"pi_%d","amount":%d}}}`, id, j, j)
}

// limitSQL is idemd-bench's limit (cmd/idemd-bench/limit.go, unnest) on BenchmarkApply's
// tables: $1 scope, $2 effect topic, $3 outbox topic, $4 headers, then the columns.
const limitSQL = `WITH u (id, fp, payload, part, off, op) AS (
    SELECT * FROM unnest($5::text[], $6::bytea[], $7::bytea[], $8::int[], $9::bigint[], $10::uuid[])),
ins AS (INSERT INTO {schema}.processed_messages (scope, message_id, fingerprint, status, received_at, completed_at, expires_at, epoch)
        SELECT $1, u.id, u.fp, 'done', now(), now(), now() + interval '7 days', (SELECT max(epoch) FROM {schema}.processed_epochs)
        FROM u ON CONFLICT DO NOTHING RETURNING message_id),
eff AS (INSERT INTO {schema}.fx (message_id, payload, topic, part, off)
        SELECT u.id, convert_from(u.payload, 'UTF8')::jsonb, $2, u.part, u.off FROM u JOIN ins ON ins.message_id = u.id)
INSERT INTO {schema}.outbox (operation_id, pipeline, causation_id, topic, payload, headers)
SELECT u.op, $1, u.id, $3, u.payload, $4::jsonb FROM u JOIN ins ON ins.message_id = u.id`

// limitBatch writes batch i of BenchmarkApply's messages with limitSQL, in key order as
// idemd's claim inserts them, in one transaction.
func limitBatch(b *testing.B, db *pgtest.DB, run, i, size int) {
	type row struct {
		id      string
		payload []byte
	}
	rows := make([]row, size)
	for j := range rows {
		rows[j].id, rows[j].payload = applyBenchMessage(run, i, j)
	}
	slices.SortFunc(rows, func(a, b row) int { return strings.Compare(a.id, b.id) })
	ids, fps, payloads := make([]string, size), make([][]byte, size), make([][]byte, size)
	parts, offs, ops := make([]int32, size), make([]int64, size), make([]uuid.UUID, size)
	for j, r := range rows {
		ids[j], fps[j], payloads[j] = r.id, []byte("fp"), r.payload
		offs[j], ops[j] = int64(i*size+j), outbox.OperationID("bench", r.id, 0)
	}
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, db.Q(limitSQL), "bench", "in", "out", `{"content-type":"application/json"}`, ids, fps, payloads, parts, offs, ops)
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
}

// backendPID is the PostgreSQL backend of pool's only connection.
func backendPID(tb testing.TB, pool *pgxpool.Pool) int {
	var pid int
	require.NoError(tb, pool.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&pid))
	return pid
}

// procCPU is the user and system time of process pid (USER_HZ 100).
func procCPU(tb testing.TB, pid int) time.Duration {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		tb.Skipf("the PostgreSQL server is not local: %v", err)
	}
	f := strings.Fields(string(raw)[strings.LastIndexByte(string(raw), ')')+1:])
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+s) * 10 * time.Millisecond
}

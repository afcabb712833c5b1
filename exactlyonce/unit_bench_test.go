package exactlyonce_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

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
// one statement per batch (Effect.Many).
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
	for _, many := range []bool{false, true} {
		b.Run(map[bool]string{false: "one-by-one", true: "many"}[many], func(b *testing.B) {
			run++
			pid := backendPID(b, db.Pool)
			cpu0 := procCPU(b, pid)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				msgs := make([]*exactlyonce.Message, size)
				for j := range msgs {
					id := fmt.Sprintf("evt_%d_%d_%d", run, i, j)
					if j%5 == 4 && i > 0 {
						id = fmt.Sprintf("evt_%d_%d_%d", run, i-1, j)
					}
					payload := fmt.Appendf(nil, `{"id":%q,"object":"event","type":"payment_intent.succeeded","data":{"object":{"id":"pi_%d","amount":%d}}}`, id, j, j)
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

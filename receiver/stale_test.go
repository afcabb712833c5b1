package receiver

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/internal/metrics"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/pipeline"
)

// staleSetup is a stripe source with the stale-event guard on the customer id and a version
// field; its effect sets the customer's state and logs every application.
func staleSetup(t *testing.T, name string) *bundle {
	return setup(t, 8, func(db *pgtest.DB) Config {
		db.Exec(t, db.Q(`CREATE TABLE {schema}.customers (id text PRIMARY KEY, version int NOT NULL)`))
		return Config{Sources: []Source{{
			Name:   name,
			Path:   "/webhooks/stripe",
			Verify: Verify{Scheme: SchemeStripe, Secrets: []string{testSecret}},
			Order:  &pipeline.Order{Entity: pipeline.Field{JSON: "/data/object/id"}, Version: pipeline.Field{JSON: "/data/object/version"}},
			Effect: Effect{SQL: db.Q(`WITH s AS (
    INSERT INTO {schema}.customers (id, version) VALUES (@payload::jsonb #>> '{data,object,id}', (@payload::jsonb #>> '{data,object,version}')::int)
    ON CONFLICT (id) DO UPDATE SET version = excluded.version)
INSERT INTO {schema}.effects (message_id, amount) VALUES (@message_id, (@payload::jsonb #>> '{data,object,version}')::bigint)`)},
		}}}
	})
}

func customerEvent(version int) []byte {
	return []byte(fmt.Sprintf(`{"id":"evt_v%d","type":"customer.updated","data":{"object":{"id":"cus_1","version":%d}}}`, version, version))
}

// version is the customer's state.
func (b *bundle) version(t *testing.T) int {
	var v int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), b.db.Q(`SELECT version FROM {schema}.customers WHERE id = 'cus_1'`)).Scan(&v))
	return v
}

// appliedVersions are the versions whose effect ran, in the order they were applied.
func (b *bundle) appliedVersions(t *testing.T) []int {
	rows, err := b.db.Pool.Query(context.Background(), b.db.Q(`SELECT amount FROM {schema}.effects ORDER BY id`))
	require.NoError(t, err)
	var out []int
	for rows.Next() {
		var v int
		require.NoError(t, rows.Scan(&v))
		out = append(out, v)
	}
	require.NoError(t, rows.Err())
	return out
}

// TestStaleWebhooksInOrder: 100 versions of one customer arrive shuffled. Every event older
// than the newest applied so far is recorded (a resend is a duplicate), not applied, and
// answered 200 {"status":"stale"}; the final state is the newest version.
func TestStaleWebhooksInOrder(t *testing.T) {
	t.Parallel()
	name := pgtest.SchemaName(t) // a pipeline of its own: its metrics are its own
	b := staleSetup(t, name)
	versions := rand.Perm(100)
	newest, stale := -1, 0
	for _, v := range versions {
		r := b.stripe(t, customerEvent(v))
		require.Equal(t, 200, r.status, "%s", r.body)
		want := "processed"
		if v < newest {
			want = "stale"
			stale++
		}
		require.Equal(t, map[string]any{"status": want, "message_id": fmt.Sprintf("evt_v%d", v)}, r.json(t), "version %d after %d", v, newest)
		newest = max(newest, v)
	}
	require.Equal(t, 99, b.version(t))
	require.Equal(t, 100, b.db.Count(t, "{schema}.processed_messages"), "every event is recorded")
	require.Equal(t, 100-stale, b.effects(t))
	require.IsIncreasing(t, b.appliedVersions(t))
	require.Equal(t, float64(stale), testutil.ToFloat64(metrics.Stale.WithLabelValues(name)))

	// A stale event sent again is a duplicate of its record; a new event without a version
	// cannot be ordered: dead-lettered.
	for _, v := range versions {
		if v < 99 {
			require.Equal(t, "duplicate", b.stripe(t, customerEvent(v)).json(t)["status"])
			break
		}
	}
	r := b.stripe(t, []byte(`{"id":"evt_nov","type":"customer.updated","data":{"object":{"id":"cus_1"}}}`))
	require.Equal(t, 202, r.status)
	require.Equal(t, "dead_lettered", r.json(t)["status"])
	require.Equal(t, 1, b.db.Count(t, "{schema}.dead_letters WHERE reason LIKE 'order: version%missing'"))
}

// TestStaleWebhooksConcurrent: the same 100 versions sent all at once, group-committed in
// shared transactions: never is an older version applied after a newer one, and the final
// state is the newest.
func TestStaleWebhooksConcurrent(t *testing.T) {
	t.Parallel()
	name := pgtest.SchemaName(t)
	b := staleSetup(t, name)
	var wg sync.WaitGroup
	statuses := make([]string, 100)
	for i, v := range rand.Perm(100) {
		wg.Go(func() { statuses[i] = b.stripe(t, customerEvent(v)).json(t)["status"].(string) })
	}
	wg.Wait()
	stale := 0
	for _, s := range statuses {
		require.Contains(t, []string{"processed", "stale"}, s)
		if s == "stale" {
			stale++
		}
	}
	require.Equal(t, 99, b.version(t))
	require.IsIncreasing(t, b.appliedVersions(t))
	require.Equal(t, 100-stale, b.effects(t))
	require.Equal(t, float64(stale), testutil.ToFloat64(metrics.Stale.WithLabelValues(name)))
}

// TestStaleReplay: a webhook dead-lettered before a newer version of its entity was applied
// is replayed as stale once its cause is fixed: effect skipped, letter done, counted as a
// stale message and a stale replay of the source, not as processed.
func TestStaleReplay(t *testing.T) {
	t.Parallel()
	name := pgtest.SchemaName(t)
	b := staleSetup(t, name)
	b.db.Exec(t, b.db.Q(`ALTER TABLE {schema}.effects ADD CONSTRAINT not_v1 CHECK (message_id <> 'evt_v1')`))
	require.Equal(t, "dead_lettered", b.stripe(t, customerEvent(1)).json(t)["status"])
	require.Equal(t, "processed", b.stripe(t, customerEvent(2)).json(t)["status"])
	letters, err := deadletter.New(b.db.Schema).List(context.Background(), b.db.Pool, deadletter.Filter{Pipeline: name})
	require.NoError(t, err)
	require.Len(t, letters, 1)
	b.db.Exec(t, b.db.Q(`ALTER TABLE {schema}.effects DROP CONSTRAINT not_v1`))

	rp := deadletter.NewReplayer(b.db.Pool, deadletter.New(b.db.Schema))
	b.rcv.RegisterReplay(rp)
	processed, stale := metrics.Processed.WithLabelValues(name), metrics.Stale.WithLabelValues(name)
	replayed := metrics.DeadLettersReplayed.WithLabelValues(name, string(deadletter.DoorHTTP), "stale")
	before := []float64{testutil.ToFloat64(processed), testutil.ToFloat64(stale), testutil.ToFloat64(replayed)}
	done, err := rp.Replay(context.Background(), letters[0].ID)
	require.NoError(t, err)
	require.Contains(t, done.Done, "stale message, effect skipped")
	require.Equal(t, deadletter.ReplayStale, done.Outcome)
	require.Equal(t, []int{2}, b.appliedVersions(t))
	require.Equal(t, 2, b.version(t))
	require.Equal(t, []float64{before[0], before[1] + 1, before[2] + 1},
		[]float64{testutil.ToFloat64(processed), testutil.ToFloat64(stale), testutil.ToFloat64(replayed)},
		"processed, stale, replayed as stale")
}

package receiver

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/pipeline"
)

// TestRetryOfAnInFlightWebhookHoldsUpNoBatch: while a webhook's effect runs long, a retry of
// it waits for it outside the batches, so that other webhooks are applied meanwhile; then
// the retry is a duplicate. Before, the retry's claim waited in a batch on the first's
// uncommitted row and held that batch, and with two workers every later webhook waited for
// a worker until the first committed.
func TestRetryOfAnInFlightWebhookHoldsUpNoBatch(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	var lockKey int64
	b := setup(t, 8, func(db *pgtest.DB) Config {
		// The effect of evt_slow waits for an advisory lock the test holds.
		lockKey = int64(len(db.Schema))*1_000_003 + time.Now().UnixNano()%1_000_000
		return Config{Workers: 2, ApplyTimeout: 20 * time.Second, Sources: []Source{{
			Name: "open", Verify: Verify{Scheme: SchemeNone}, AllowUnverified: true,
			MessageID: &pipeline.Field{Header: "X-Id"},
			Effect: Effect{SQL: db.Q(fmt.Sprintf(`INSERT INTO {schema}.effects (message_id, amount)
				VALUES (@message_id, CASE WHEN @message_id = 'evt_slow' THEN (SELECT 1 FROM pg_advisory_xact_lock_shared(%d)) ELSE 1 END)`, lockKey))},
		}}}
	})
	send := func(id string) <-chan int {
		out := make(chan int, 1)
		go func() {
			req, _ := http.NewRequestWithContext(ctx, "POST", b.srv.URL+"/webhooks/open", bytes.NewReader([]byte(`{}`)))
			req.Header.Set("X-Id", id)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				out <- 0
				return
			}
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			out <- res.StatusCode
		}()
		return out
	}
	holder, err := b.db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer holder.Release()
	_, err = holder.Exec(ctx, "SELECT pg_advisory_lock($1)", lockKey)
	require.NoError(t, err)
	unlocked := false
	unlock := func() {
		if !unlocked {
			unlocked = true
			_, err := holder.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", lockKey)
			require.NoError(t, err)
		}
	}
	defer unlock()

	first := send("evt_slow")
	require.Eventually(t, func() bool {
		var waiting int
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
AND classid = (($1::bigint >> 32) & 4294967295)::oid AND objid = ($1::bigint & 4294967295)::oid`, lockKey).Scan(&waiting))
		return waiting == 1
	}, 10*time.Second, 5*time.Millisecond, "the first delivery's effect waits for the lock")
	retries := []<-chan int{send("evt_slow"), send("evt_slow")}
	time.Sleep(300 * time.Millisecond) // the retries reach the receiver (and, before, a batch each)

	for i := range 5 {
		select {
		case status := <-send(fmt.Sprintf("evt_other_%d", i)):
			require.Equal(t, http.StatusOK, status, "another webhook, while the first is in its transaction")
		case <-time.After(10 * time.Second):
			t.Fatal("another webhook waited for the first delivery's transaction")
		}
	}
	select {
	case status := <-first:
		t.Fatalf("the first delivery was answered (%d) before its effect could run", status)
	default:
	}
	unlock()
	require.Equal(t, http.StatusOK, <-first)
	for _, r := range retries {
		require.Equal(t, http.StatusOK, <-r)
	}
	require.Equal(t, 1, b.db.Count(t, "{schema}.effects WHERE message_id = 'evt_slow'"), "the retries are duplicates")
	require.Equal(t, 6, b.effects(t))
}

package delivery_test

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/delivery"
	"github.com/idemd/idemd/outbox"
)

// TestEveryRetryableStatusIsRetried: 408, 425, 429 and 5xx mean "try again later" (SPEC
// 2.6b): an event answered one of them is retried, with the same key, and delivered on the
// next attempt; nothing is dead-lettered. Only 429 and 5xx were answered in the other tests,
// so a sink that dead-lettered a 408 or a 425 as a refusal passed before.
func TestEveryRetryableStatusIsRetried(t *testing.T) {
	t.Parallel()
	for _, status := range []int{http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests,
		http.StatusInternalServerError, http.StatusServiceUnavailable} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			e := newEndpoint(t, func(w http.ResponseWriter, r *http.Request, n int) {
				if n == 1 {
					w.WriteHeader(status)
					return
				}
				w.WriteHeader(http.StatusNoContent)
			})
			b.enqueue(t, event("partner", "m1", "k", `{"n":1}`))
			b.start(t, delivery.Config{Endpoints: []delivery.Endpoint{endpointConfig("partner", e)}})
			var first delivery.Attempt
			select {
			case first = <-b.attempts:
			case <-time.After(60 * time.Second):
				t.Fatal("no attempt")
			}
			require.Equal(t, status, first.Status)
			require.Equal(t, delivery.Retry, first.Outcome, "a %d is retried", status)
			b.waitFor(t, delivery.Delivered, 1)
			op := outbox.OperationID("p", "m1", 0).String()
			attempts, accepted, _ := e.snapshot()
			require.Len(t, attempts[op], 2)
			require.Equal(t, 1, accepted[op])
			require.Zero(t, b.db.Count(t, "{schema}.dead_letters"))
			require.Equal(t, 1, b.db.Count(t, "{schema}.http_deliveries WHERE state = 'delivered' AND attempts = 2"))
		})
	}
}

// TestRetriesStopAtMaxAge: an event whose next attempt would start more than MaxAge after it
// was enqueued is dead-lettered instead of retried (Config.MaxAge, the retry budget's
// horizon). Every other test ended its retries by MaxAttempts, so a sink that ignored MaxAge
// and kept retrying an event for MaxAttempts whatever its age passed before.
func TestRetriesStopAtMaxAge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	e := newEndpoint(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	b.enqueue(t, event("partner", "old", "", `{}`))
	// Enqueued two hours ago, with a budget of an hour: the first failure is the last.
	b.db.Exec(t, b.db.Q(`UPDATE {schema}.http_deliveries SET created_at = now() - interval '2 hours'`))
	b.start(t, delivery.Config{Endpoints: []delivery.Endpoint{endpointConfig("partner", e)}, MaxAge: time.Hour})
	seen := b.waitFor(t, delivery.DeadLettered, 1)
	require.Len(t, seen, 1, "no retry after the first failure")
	require.Equal(t, 1, seen[0].Number)
	require.Equal(t, 503, seen[0].Status)
	letters, err := deadletter.New(b.db.Schema).List(context.Background(), b.db.Pool, deadletter.Filter{})
	require.NoError(t, err)
	require.Len(t, letters, 1)
	require.Contains(t, letters[0].Reason, "retries exhausted: next attempt would start more than 1h0m0s after the event")
	require.Equal(t, 1, b.db.Count(t, "{schema}.http_deliveries WHERE state = 'dead' AND attempts = 1"))
}

// TestPruneFinishedNeverTouchesPending: the pruner deletes delivered and dead deliveries
// finished more than the retention ago, and nothing else: a pending delivery, however old,
// is an event still to deliver. PruneFinished had no test: a prune that went by age alone,
// deleting old pending deliveries (an endpoint disabled for days), passed before.
func TestPruneFinishedNeverTouchesPending(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var events []outbox.Event
	for _, c := range []string{"delivered-old", "dead-old", "pending-old", "delivered-new", "pending-new"} {
		events = append(events, event("partner", c, "", `{}`))
	}
	b.enqueue(t, events...)
	b.db.Exec(t, b.db.Q(`UPDATE {schema}.http_deliveries SET created_at = now() - interval '3 days',
    state = CASE causation_id WHEN 'delivered-old' THEN 'delivered' WHEN 'dead-old' THEN 'dead' ELSE 'pending' END,
    finished_at = CASE WHEN causation_id IN ('delivered-old', 'dead-old') THEN now() - interval '2 days' END
WHERE causation_id LIKE '%-old'`))
	b.db.Exec(t, b.db.Q(`UPDATE {schema}.http_deliveries SET state = 'delivered', finished_at = now() - interval '1 minute'
WHERE causation_id = 'delivered-new'`))

	n, err := delivery.NewStore(b.db.Schema).PruneFinished(context.Background(), b.db.Pool, 24*time.Hour, 1)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	require.Equal(t, 2, b.db.Count(t, "{schema}.http_deliveries WHERE state = 'pending'"), "pending deliveries are never pruned")
	require.Equal(t, 1, b.db.Count(t, "{schema}.http_deliveries WHERE causation_id = 'delivered-new'"), "finished within the retention: kept")
	require.Equal(t, 3, b.db.Count(t, "{schema}.http_deliveries"))
}

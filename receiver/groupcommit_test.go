package receiver

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
)

// TestGroupCommitPoisonDoesNotFailNeighbours: concurrent webhooks share transactions (group
// commit, their effects sent in one round trip); one of them violates a constraint. Its
// neighbours are applied and answered 200, it alone is dead-lettered (202), and every event
// of an applied webhook is in the outbox with its own operation id.
func TestGroupCommitPoisonDoesNotFailNeighbours(t *testing.T) {
	t.Parallel()
	const n = 40
	b := setup(t, 8, func(db *pgtest.DB) Config {
		return Config{Sources: []Source{stripeSource(db)}, Linger: 20 * time.Millisecond, Workers: 1}
	})
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		codes = map[int]int{}
	)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			amount := 100 + i
			if i == n/2 {
				amount = -1 // CHECK (amount >= 0)
			}
			r := b.stripe(t, stripeEvent(fmt.Sprintf("evt_gc_%d", i), amount, ""))
			mu.Lock()
			codes[r.status]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	require.Equal(t, map[int]int{http.StatusOK: n - 1, http.StatusAccepted: 1}, codes)
	require.Equal(t, n-1, b.effects(t))
	require.Equal(t, n-1, b.db.Count(t, "{schema}.outbox"))
	require.Equal(t, n-1, b.db.Count(t, "(SELECT DISTINCT operation_id FROM {schema}.outbox) ids"))
	require.Equal(t, 1, b.db.Count(t, "{schema}.dead_letters WHERE message_id = $1", fmt.Sprintf("evt_gc_%d", n/2)))
	require.Equal(t, n, b.db.Count(t, "{schema}.processed_messages"))
	// Rows written by one transaction share its xmin: fewer transactions than requests
	// means requests really were grouped.
	require.Less(t, b.db.Count(t, "(SELECT DISTINCT xmin::text FROM {schema}.processed_messages) txs"), n)
}

// TestLingerBoundsABatchsWait: while a batch is committing, the next one waits up to Linger
// for more requests, once: a steady stream of requests, each arriving well within Linger
// of the one before, does not hold it open until MaxBatch. The first batch is held in
// BeforeCommit while the stream runs, so that the second lingers the whole time.
func TestLingerBoundsABatchsWait(t *testing.T) {
	t.Parallel()
	const (
		linger = 40 * time.Millisecond
		every  = 4 * time.Millisecond
		n      = 80 // over 300 ms: eight Lingers
	)
	var (
		mu      sync.Mutex
		sizes   []int
		release = make(chan struct{})
		first   sync.Once
	)
	b := setup(t, 4, func(db *pgtest.DB) Config {
		return Config{Sources: []Source{stripeSource(db)}, Linger: linger, Workers: 2, MaxBatch: n,
			BeforeCommit: func(ids []string) {
				held := false
				first.Do(func() { held = true })
				if held {
					<-release
					return
				}
				mu.Lock()
				sizes = append(sizes, len(ids))
				mu.Unlock()
			}}
	})
	var wg sync.WaitGroup
	send := func(i int) {
		defer wg.Done()
		r := b.stripe(t, stripeEvent(fmt.Sprintf("evt_linger_%d", i), 100, ""))
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	}
	wg.Add(1)
	go send(0)
	require.Eventually(t, func() bool { return len(b.rcv.sem) == 1 }, 5*time.Second, time.Millisecond)
	tick := time.NewTicker(every)
	for i := 1; i < n; i++ {
		<-tick.C
		wg.Add(1)
		go send(i)
	}
	tick.Stop()
	close(release)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, sizes)
	// Renewed by each arrival, the second batch's wait lasted until the stream ended: all
	// n-1 requests in it. Once per batch, it closes after about linger/every of them.
	require.Less(t, sizes[0], n/2, "the second batch's sizes, in commit order: %v", sizes)
	require.Equal(t, n, b.effects(t))
}

// TestNoWorkerAnswers503WithinApplyTimeout: a webhook waits for a worker at most
// ApplyTimeout. With the only worker's batch held (in BeforeCommit, which does not watch
// its context), the requests behind it, the one the batcher holds and the one still
// handing itself over, are answered 503 (busy, Retry-After) within the timeout, long before
// the held batch ends, with nothing stored; sent again once a worker is free, they apply.
func TestNoWorkerAnswers503WithinApplyTimeout(t *testing.T) {
	t.Parallel()
	const timeout = 300 * time.Millisecond
	var (
		held    = make(chan struct{})
		release = make(chan struct{})
		first   sync.Once
	)
	b := setup(t, 4, func(db *pgtest.DB) Config {
		return Config{Sources: []Source{stripeSource(db)}, Workers: 1, ApplyTimeout: timeout,
			BeforeCommit: func([]string) {
				first.Do(func() {
					close(held)
					<-release
				})
			}}
	})
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(free) // before the receiver's Close, which waits for the held batch
	answers := make(chan resp, 3)
	post := func(id string) {
		answers <- b.stripe(t, stripeEvent(id, 100, ""))
	}
	go post("evt_held")
	<-held
	start := time.Now()
	go post("evt_behind_1")
	go post("evt_behind_2")
	for range 2 {
		select {
		case r := <-answers:
			require.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r.body)
			require.Equal(t, "unavailable", r.problemType(t))
			require.Equal(t, "1", r.header.Get("Retry-After"))
			require.Contains(t, r.json(t)["detail"], "busy")
		case <-time.After(10 * timeout):
			t.Fatalf("no answer %s after the requests behind the held batch were sent: they wait for the worker without bound", time.Since(start))
		}
	}
	free()
	held1 := <-answers // its own transaction outlived the timeout while held: 503, rolled back
	require.Equal(t, http.StatusServiceUnavailable, held1.status, "%s", held1.body)
	require.Equal(t, 0, b.db.Count(t, "{schema}.processed_messages"))
	require.Equal(t, 0, b.effects(t))
	// Sent again as a sender would: a 503 is retried. The worker is free now, but on a
	// loaded machine (CI under -race) a transaction can itself outlive the short timeout;
	// what must hold is that each applies once it gets through, and only once.
	for _, id := range []string{"evt_held", "evt_behind_1", "evt_behind_2"} {
		r := until503Passes(func() resp { return b.stripe(t, stripeEvent(id, 100, "")) })
		require.Equal(t, http.StatusOK, r.status, "%s: %s", id, r.body)
	}
	require.Equal(t, 3, b.effects(t))
	require.Equal(t, 3, b.db.Count(t, "{schema}.processed_messages"))
}

package main

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/kafkatest"
	"github.com/idemd/idemd/outbox"
)

// TestShutdownUnderLoad: SIGTERM while clients keep sending. Every request answered 2xx has
// its effect and its outbox row published (the relay flushed), the exit is clean and within
// IDEMD_SHUTDOWN_TIMEOUT.
func TestShutdownUnderLoad(t *testing.T) {
	t.Parallel()
	const timeout = 15 * time.Second
	s := serveStack(t, timeout)

	var (
		mu      sync.Mutex
		acked   []string
		sent    atomic.Int64
		stop    = make(chan struct{})
		wg      sync.WaitGroup
		enough  = make(chan struct{})
		enoughO sync.Once
	)
	client := &http.Client{Timeout: 10 * time.Second}
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("evt_load_%d_%d", w, i)
				body := fmt.Sprintf(`{"id":%q,"object":"event","data":{"object":{"id":"pi_%d","amount":%d}}}`, id, w, i)
				resp, err := client.Do(stripeRequest(t, "http://"+s.httpAddr+"/webhooks/stripe", stripeSecret, []byte(body)))
				if err != nil {
					continue // refused once the listener closed: the sender retries later
				}
				resp.Body.Close()
				if resp.StatusCode/100 == 2 {
					mu.Lock()
					acked = append(acked, id)
					mu.Unlock()
				}
				if sent.Add(1) == 200 {
					enoughO.Do(func() { close(enough) })
				}
			}
		}()
	}
	select {
	case <-enough:
	case <-time.After(60 * time.Second):
		t.Fatal("the load did not get going")
	}

	code, took := stopIdemd(t, s.p, timeout)
	close(stop)
	wg.Wait()
	require.Equal(t, 0, code, "clean exit")
	require.Less(t, took, timeout)
	require.NotEmpty(t, acked)

	ctx := context.Background()
	var missing int
	require.NoError(t, s.pool.QueryRow(ctx, "SELECT count(*) FROM unnest($1::text[]) AS a(id) WHERE NOT EXISTS (SELECT 1 FROM "+s.schema+".payments p WHERE p.event_id = a.id)", acked).Scan(&missing))
	require.Zero(t, missing, "every 2xx has its effect")
	var unpublished int
	require.NoError(t, s.pool.QueryRow(ctx, "SELECT count(*) FROM "+s.schema+".outbox WHERE published_at IS NULL").Scan(&unpublished))
	require.Zero(t, unpublished, "the relay flushed the outbox before exiting")
	// The relay deleted what it published: every effect's event is on the topic.
	payments := s.count(t, "payments")
	published := map[string]bool{}
	for _, r := range kafkatest.ReadAtLeastFrom(t, kafkatest.Brokers(t), s.topic, payments, 30*time.Second, 300*time.Millisecond) {
		published[kafkatest.Header(r, outbox.HeaderCausationID)] = true
	}
	require.Len(t, published, payments, "every effect's event reached the topic")
	t.Logf("%d requests acknowledged; exit after %s", len(acked), took)
}

package receiver

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/pgtest"
)

// BenchmarkWebhooks measures verified Stripe webhooks per second through the real handler
// over keep-alive HTTP connections at 64 concurrency, with group commit and with one
// transaction per request (MaxBatch=1). Each delivery is a new id with an SQL effect and an
// outbox event.
func BenchmarkWebhooks(b *testing.B) {
	var rates [2]float64
	for i, maxBatch := range []int{MaxBatchDefault, 1} {
		b.Run(fmt.Sprintf("max_batch=%d", maxBatch), func(b *testing.B) {
			rates[i] = benchWebhooks(b, maxBatch)
		})
	}
	if rates[1] > 0 {
		b.Logf("group commit / one transaction per request: %.2fx", rates[0]/rates[1])
	}
}

func benchWebhooks(b *testing.B, maxBatch int) float64 {
	db := pgtest.NewWithOptions(b, pgtest.Options{MaxConns: 16})
	db.Exec(b, db.Q(`CREATE TABLE {schema}.effects (
		id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, message_id text, tenant text,
		body jsonb, amount bigint CHECK (amount >= 0))`))
	r, err := New(db.Pool, &Config{Schema: db.Schema, MaxBatch: maxBatch, Sources: []Source{stripeSource(db)}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(r.Close)
	srv := httptest.NewServer(r)
	b.Cleanup(srv.Close)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, MaxConnsPerHost: 64}}

	const workers = 64
	n := max(b.N, 2000)
	var next atomic.Int64
	lat := make([][]time.Duration, workers)
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				body := stripeEvent(fmt.Sprintf("evt_%d_%d", maxBatch, i), 1, "")
				req, _ := http.NewRequest("POST", srv.URL+"/webhooks/stripe", bytes.NewReader(body))
				req.Header.Set("Stripe-Signature", stripeSig(testSecret, time.Now(), body))
				t0 := time.Now()
				res, err := client.Do(req)
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if res.StatusCode != 200 {
					b.Errorf("status %d", res.StatusCode)
					return
				}
				lat[w] = append(lat[w], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	all := slices.Concat(lat...)
	slices.Sort(all)
	rate := float64(len(all)) / elapsed.Seconds()
	b.ReportMetric(rate, "req/s")
	if len(all) > 0 {
		b.ReportMetric(float64(all[len(all)/2].Microseconds())/1000, "p50_ms")
		b.ReportMetric(float64(all[len(all)*99/100].Microseconds())/1000, "p99_ms")
	}
	return rate
}

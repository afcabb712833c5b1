package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

const stripeSecret = "whsec_idemd_bench_secret"

// benchReceiver loads the receiver (in a child process) with Stripe-signed webhooks over
// -concurrency keep-alive connections, group-committed and with one transaction per
// request, and checks that every 200 "processed" answer is a durable processed row.
func benchReceiver(ctx context.Context, e *env, res *Results) error {
	for _, mode := range []struct {
		name     string
		maxBatch int
		d        time.Duration
	}{
		{fmt.Sprintf("group commit, MaxBatch %d", e.o.maxBatch), e.o.maxBatch, e.o.duration},
		{"one tx per request, MaxBatch 1", 1, e.o.durationOne},
	} {
		if err := e.truncate(ctx); err != nil {
			return err
		}
		c, err := e.startChild(ctx, "receiver", childConfig{
			MaxConns: int32(e.o.receiverConns), OutboxTopic: "bench.webhooks", Batch: mode.maxBatch, Secret: stripeSecret,
			ProfileName: fmt.Sprintf("receiver-maxbatch%d", mode.maxBatch),
		})
		if err != nil {
			return err
		}
		st, err := e.loadWebhooks(ctx, "http://"+c.Ready+"/webhooks/stripe", fmt.Sprintf("wh%d", mode.maxBatch), mode.d)
		if err != nil {
			c.kill()
			return err
		}
		rss, err := c.stop()
		if err != nil {
			return err
		}
		stored, err := e.count(ctx, "{schema}.processed_messages WHERE status = 'done'")
		if err != nil {
			return err
		}
		effects, err := e.count(ctx, "{schema}.effects")
		if err != nil {
			return err
		}
		if int64(stored) != st.ok || int64(effects) != st.ok {
			return fmt.Errorf("receiver answered %d webhooks processed but stored %d records and %d effects", st.ok, stored, effects)
		}
		if st.failed > 0 {
			return fmt.Errorf("receiver: %d of %d requests were not answered 200 processed (first: %s)", st.failed, st.ok+st.failed, st.firstErr)
		}
		rate := float64(st.ok) / st.elapsed.Seconds()
		r := Row{Section: "receiver", Mode: mode.name, Count: int(st.ok), Seconds: st.elapsed.Seconds(), Rate: rate, Unit: "webhooks/s",
			P50ms: st.pct(0.50), P99ms: st.pct(0.99), P999ms: st.pct(0.999), PeakRSSMiB: rss,
			Note: fmt.Sprintf("%d connections; every 200 is a committed processed row", e.o.concurrency)}
		e.logf("receiver %s: %d webhooks in %s: %.0f/s, p50 %.1f ms p99 %.1f ms p999 %.1f ms, peak RSS %.1f MiB",
			mode.name, st.ok, st.elapsed.Round(time.Millisecond), rate, r.P50ms, r.P99ms, r.P999ms, rss)
		if mode.maxBatch == 1 {
			res.ReceiverOne = &r
		} else {
			res.Receiver = &r
		}
	}
	return nil
}

type loadStats struct {
	ok, failed int64
	firstErr   string
	elapsed    time.Duration
	lat        []time.Duration
}

func (s *loadStats) pct(p float64) float64 { return percentile(s.lat, p) }

// percentile of sorted-in-place durations, in milliseconds.
func percentile(d []time.Duration, p float64) float64 {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	i := min(int(float64(len(d))*p), len(d)-1)
	return float64(d[i].Microseconds()) / 1000
}

// loadWebhooks sends signed webhooks with unique ids from -concurrency workers, each on its
// own keep-alive connection, for d.
func (e *env) loadWebhooks(ctx context.Context, url, prefix string, d time.Duration) (*loadStats, error) {
	n := e.o.concurrency
	tr := &http.Transport{
		MaxIdleConns: n, MaxIdleConnsPerHost: n, MaxConnsPerHost: n, DisableCompression: true,
		DialContext: (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	var (
		seq      atomic.Int64
		st       = &loadStats{}
		mu       sync.Mutex
		wg       sync.WaitGroup
		stopAt   = time.Now().Add(d)
		begin    = time.Now()
		okBody   = []byte(`"processed"`)
		key      = []byte(stripeSecret)
		firstErr atomic.Value
		failed   atomic.Int64
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat := make([]time.Duration, 0, 4096)
			var ok int64
			mac := hmac.New(sha256.New, key)
			buf := make([]byte, 0, 512)
			for time.Now().Before(stopAt) && ctx.Err() == nil {
				i := int(seq.Add(1))
				id := prefix + "-" + strconv.Itoa(i)
				body := eventBody(id, i)
				ts := strconv.FormatInt(time.Now().Unix(), 10)
				mac.Reset()
				mac.Write([]byte(ts))
				mac.Write([]byte{'.'})
				mac.Write(body)
				buf = append(buf[:0], "t="...)
				buf = append(buf, ts...)
				buf = append(buf, ",v1="...)
				buf = hex.AppendEncode(buf, mac.Sum(nil))
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
				if err != nil {
					firstErr.CompareAndSwap(nil, err.Error())
					failed.Add(1)
					return
				}
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Stripe-Signature", string(buf))
				start := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					firstErr.CompareAndSwap(nil, err.Error())
					failed.Add(1)
					continue
				}
				got, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				took := time.Since(start)
				if err != nil || resp.StatusCode != http.StatusOK || !bytes.Contains(got, okBody) {
					firstErr.CompareAndSwap(nil, fmt.Sprintf("%d %s %v", resp.StatusCode, got, err))
					failed.Add(1)
					continue
				}
				ok++
				lat = append(lat, took)
			}
			mu.Lock()
			st.ok += ok
			st.lat = append(st.lat, lat...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	st.elapsed = time.Since(begin)
	st.failed = failed.Load()
	if v := firstErr.Load(); v != nil {
		st.firstErr = v.(string)
	}
	return st, ctx.Err()
}

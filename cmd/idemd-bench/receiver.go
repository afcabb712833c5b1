package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemd/idemd/consumer"
	"github.com/idemd/idemd/outbox"
)

const stripeSecret = "whsec_idemd_bench_secret"

// defaultSource is the receivers' source name (their dedup scope and path) unless a section
// names another.
const defaultSource = "stripe"

// naiveConns is the naive receiver's pool size: the most the bench allows itself (one
// transaction per request gains from more connections; idemd's receiver uses
// -receiver-conns).
const naiveConns = 16

// benchReceiver loads the receiver (in a child process) with Stripe-signed webhooks over
// -concurrency keep-alive connections, with one transaction per request, then
// group-committed in turns with the naive net/http receiver, and checks that every 200
// "processed" answer is a durable processed row with its effect.
//
// The group-committed receiver and the naive receiver, whose ratio is a goal, run side by
// side in two children and are loaded in turns of -duration / -receiver-turns each, in the
// order A B B A A B…: on a shared machine whose speed drifts over a run, each gets its share
// of the fast and the slow minutes. Each one's rate is its answers over its own loaded time.
func benchReceiver(ctx context.Context, e *env, res *Results) error {
	if err := e.truncate(ctx); err != nil {
		return err
	}
	one := &receiverSide{name: "idemd, one tx per request, MaxBatch 1", kind: "receiver", maxBatch: 1, conns: e.o.receiverConns}
	if err := e.startReceiverSide(ctx, one); err != nil {
		return err
	}
	err := e.loadReceiverSide(ctx, one, "whone", e.o.durationOne)
	if err := e.endReceiverSides(ctx, err, webhookCounts{}, one); err != nil {
		return err
	}
	res.ReceiverOne = one.row(e, 0)

	if err := e.truncate(ctx); err != nil {
		return err
	}
	group, naive, err := e.receiverTurns(ctx, "", "", false)
	if err != nil {
		return err
	}
	res.Receiver, res.Naive = group, naive
	return nil
}

// receiverTurns starts the group-committed receiver and the naive receiver of source (""
// is defaultSource), loads them in turns for -duration in all, and returns their rows, with
// label before each mode. With spread, the webhooks' ids are spread over the key space, as
// real event ids are (the growth section: rows pre-filled the same way); else prefix-N.
func (e *env) receiverTurns(ctx context.Context, source, label string, spread bool) (group, naive *Row, err error) {
	base, err := e.webhookCounts(ctx)
	if err != nil {
		return nil, nil, err
	}
	g := &receiverSide{name: fmt.Sprintf("%sidemd, group commit, MaxBatch %d", label, e.o.maxBatch), kind: "receiver",
		maxBatch: e.o.maxBatch, conns: e.o.receiverConns, source: source, spread: spread}
	n := &receiverSide{name: fmt.Sprintf("%snaive net/http, one tx per request, %d conns", label, naiveConns), kind: "naive",
		maxBatch: 1, conns: naiveConns, source: source, spread: spread}
	if err := e.startReceiverSide(ctx, g); err != nil {
		return nil, nil, err
	}
	if err := e.startReceiverSide(ctx, n); err != nil {
		g.c.kill()
		return nil, nil, err
	}
	// Each fresh child is loaded for a second first, not counted (as the relay's is): its
	// pool's connections, prepared statements and caches are cold, and its first turns
	// were its slowest, the naive receiver's more than idemd's (phase 10).
	for _, side := range []*receiverSide{g, n} {
		if err := e.warmReceiverSide(ctx, side, fmt.Sprintf("wh%s%s%d-warm", source, side.kind, side.maxBatch)); err != nil {
			g.c.kill()
			n.c.kill()
			return nil, nil, err
		}
	}
	checkpoints, writes := e.checkpoints(ctx), e.checkpointWrites(ctx)
	turn := e.o.duration / time.Duration(e.o.receiverTurns)
	for i := 0; i < 2*e.o.receiverTurns && err == nil; i++ {
		side := []*receiverSide{g, n}[(i+i/2)%2] // A B B A A B …
		err = e.loadReceiverSide(ctx, side, fmt.Sprintf("wh%s%s%d-t%d", source, side.kind, side.maxBatch, i), turn)
	}
	if err := e.endReceiverSides(ctx, err, base, g, n); err != nil {
		return nil, nil, err
	}
	group, naive = g.row(e, e.o.receiverTurns), n.row(e, e.o.receiverTurns)
	// A checkpoint's writes compete with the receivers for the disk and the CPU, and after
	// it each page's first change is logged whole: the latencies say when one ran.
	note := e.latencyNote(ctx, checkpoints)
	if after := e.checkpointWrites(ctx); writes >= 0 && after >= 0 {
		note += fmt.Sprintf(", %d buffers written by checkpoints during the turns", after-writes)
	}
	group.Note += "; " + note
	naive.Note += "; " + note
	return group, naive, nil
}

// receiverWarmUp is how long each receiver child is loaded before its measured turns.
const receiverWarmUp = time.Second

// warmReceiverSide loads s for receiverWarmUp and counts only its answers, for the check
// that every 200 is a committed row.
func (e *env) warmReceiverSide(ctx context.Context, s *receiverSide, prefix string) error {
	st, err := e.loadSide(ctx, s, prefix, receiverWarmUp)
	if err != nil {
		return err
	}
	s.warm.count(st)
	e.logf("receiver %s (%s): %d webhooks in %s, warm-up, not counted", s.name, prefix, st.ok, st.elapsed.Round(time.Millisecond))
	return nil
}

// loadSide loads s's receiver for d with webhook ids under prefix.
func (e *env) loadSide(ctx context.Context, s *receiverSide, prefix string, d time.Duration) (*loadStats, error) {
	var ids func(int) string
	if s.spread {
		ids = func(i int) string { return spreadID(prefix, i) }
	}
	return e.loadWebhooks(ctx, "http://"+s.c.Ready+"/webhooks/"+cmp.Or(s.source, defaultSource), prefix, d, 0, ids, nil)
}

// receiverSide is one receiver of the section: its child and what its loads measured.
type receiverSide struct {
	name, kind      string
	maxBatch, conns int
	source          string // "" is defaultSource
	spread          bool   // ids spread over the key space (loadWebhooks)
	c               *child
	st              loadStats
	warm            loadStats // the warm-up's answers: checked, not measured
	cpu             CPU       // summed over the loads, µs per message × messages
	cpuKnown        bool
	rss             float64
}

func (e *env) startReceiverSide(ctx context.Context, s *receiverSide) error {
	c, err := e.startChild(ctx, s.kind, childConfig{
		MaxConns: int32(s.conns), OutboxTopic: "bench.webhooks", Batch: s.maxBatch, Secret: stripeSecret, Source: s.source, Linger: e.o.linger,
		ProfileName: fmt.Sprintf("%s-maxbatch%d", s.kind, s.maxBatch),
	})
	s.c, s.cpuKnown = c, true
	return err
}

// loadReceiverSide loads s for d and adds what it measured to s.
func (e *env) loadReceiverSide(ctx context.Context, s *receiverSide, prefix string, d time.Duration) error {
	e.startCPU(ctx, s.c, s.c.cpu.app)
	st, err := e.loadSide(ctx, s, prefix, d)
	if err != nil {
		return err
	}
	cpu := e.cpuPerMessage(ctx, s.c, int(st.ok))
	if cpu == nil {
		s.cpuKnown = false
	} else {
		n := float64(st.ok)
		s.cpu.IdemdUs += cpu.IdemdUs * n
		s.cpu.PostgresUs += cpu.PostgresUs * n
		s.cpu.GeneratorUs += cpu.GeneratorUs * n
		s.cpu.RelayPostgresUs += cpu.RelayPostgresUs * n
	}
	s.st.count(st)
	s.st.elapsed += st.elapsed
	s.st.lat = append(s.st.lat, st.lat...)
	e.logf("receiver %s (%s): %d webhooks in %s", s.name, prefix, st.ok, st.elapsed.Round(time.Millisecond))
	return nil
}

// endReceiverSides stops the sides' children (killing them after a failed load, err) and
// checks that every 200 of every side is a committed row with its effect: rows and effects
// beyond base, what the tables held before.
func (e *env) endReceiverSides(ctx context.Context, err error, base webhookCounts, sides ...*receiverSide) error {
	for _, s := range sides {
		if err != nil {
			s.c.kill()
			continue
		}
		var stopErr error
		s.rss, stopErr = s.c.stop()
		err = stopErr
	}
	if err != nil {
		return err
	}
	var all loadStats
	for _, s := range sides {
		all.count(&s.warm)
		all.count(&s.st)
	}
	if err := e.checkWebhooks(ctx, base, &all); err != nil {
		names := make([]string, len(sides))
		for i, s := range sides {
			names[i] = s.name
		}
		return fmt.Errorf("%s: %w", strings.Join(names, " and "), err)
	}
	return nil
}

// row is the section's row of s, loaded in turns turns (0: at once).
func (s *receiverSide) row(e *env, turns int) *Row {
	rate := float64(s.st.ok) / s.st.elapsed.Seconds()
	var cpu *CPU
	if s.cpuKnown && s.st.ok > 0 {
		n := float64(s.st.ok)
		cpu = &CPU{IdemdUs: s.cpu.IdemdUs / n, PostgresUs: s.cpu.PostgresUs / n, GeneratorUs: s.cpu.GeneratorUs / n, RelayPostgresUs: s.cpu.RelayPostgresUs / n}
	}
	note := fmt.Sprintf("%d connections; every 200 is a committed processed row with its effect", e.o.concurrency)
	if turns > 0 {
		note += fmt.Sprintf("; loaded in %d turns of %s, in turns with the other receiver (A B B A…), after a warm-up of %s not counted (%d webhooks)",
			turns, (e.o.duration / time.Duration(turns)).Round(time.Millisecond), receiverWarmUp, s.warm.ok)
	}
	r := &Row{Section: "receiver", Mode: s.name, Count: int(s.st.ok), Seconds: s.st.elapsed.Seconds(), Rate: rate, Unit: "webhooks/s",
		P50ms: s.st.pct(0.50), P99ms: s.st.pct(0.99), P999ms: s.st.pct(0.999), PeakRSSMiB: s.rss, CPU: cpu, Note: note}
	e.logf("receiver %s: %d webhooks in %s: %.0f/s, p50 %.1f ms p99 %.1f ms p999 %.1f ms, peak RSS %.1f MiB",
		s.name, s.st.ok, s.st.elapsed.Round(time.Millisecond), rate, r.P50ms, r.P99ms, r.P999ms, s.rss)
	return r
}

// webhookCounts are the done dedup rows and the effects the tables hold.
type webhookCounts struct{ stored, effects int }

func (e *env) webhookCounts(ctx context.Context) (webhookCounts, error) {
	var c webhookCounts
	var err error
	if c.stored, err = e.count(ctx, "{schema}.processed_messages WHERE status = 'done'"); err != nil {
		return c, err
	}
	c.effects, err = e.count(ctx, "{schema}.effects")
	return c, err
}

// checkWebhooks holds the receiver to its answers: every 200 is a done row and an effect
// beyond base, what the tables held before the load.
func (e *env) checkWebhooks(ctx context.Context, base webhookCounts, st *loadStats) error {
	now, err := e.webhookCounts(ctx)
	if err != nil {
		return err
	}
	stored, effects := now.stored-base.stored, now.effects-base.effects
	if int64(stored) != st.ok || int64(effects) != st.ok {
		return fmt.Errorf("answered %d webhooks processed but stored %d records and %d effects", st.ok, stored, effects)
	}
	if st.failed > 0 {
		return fmt.Errorf("%d of %d requests were not answered 200 processed (first: %s)", st.failed, st.ok+st.failed, st.firstErr)
	}
	return nil
}

type loadStats struct {
	ok, failed int64
	firstErr   string
	elapsed    time.Duration
	lat        []time.Duration
}

// count adds st's answers, and its first error if l has none, to l.
func (l *loadStats) count(st *loadStats) {
	l.ok += st.ok
	l.failed += st.failed
	if l.firstErr == "" {
		l.firstErr = st.firstErr
	}
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

// loadWebhooks sends signed webhooks with unique ids (prefix-N, or ids(N) when ids is set)
// from -concurrency workers, each on its own keep-alive connection, for d: as fast as they
// are answered, or at rate per second when rate > 0. answered, when set, is called with N
// and the time of each 200.
func (e *env) loadWebhooks(ctx context.Context, url, prefix string, d time.Duration, rate int, ids func(int) string, answered func(n int, at time.Time)) (*loadStats, error) {
	n := e.o.concurrency
	target, err := newWebhookConn(url)
	if err != nil {
		return nil, err
	}
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
	// next hands out request numbers: at once, or on a schedule of rate per second.
	next := func() (int, bool) {
		if time.Now().After(stopAt) || ctx.Err() != nil {
			return 0, false
		}
		return int(seq.Add(1)), true
	}
	if rate > 0 {
		ticks := make(chan int, n)
		go func() {
			defer close(ticks)
			interval := time.Second / time.Duration(rate)
			for i := 1; ; i++ {
				at := begin.Add(time.Duration(i-1) * interval)
				if at.After(stopAt) || ctx.Err() != nil {
					return
				}
				if w := time.Until(at); w > 0 {
					time.Sleep(w)
				}
				ticks <- i
			}
		}()
		next = func() (int, bool) {
			i, ok := <-ticks
			return i, ok
		}
	}
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat := make([]time.Duration, 0, 4096)
			var ok int64
			conn := &webhookConn{host: target.host, path: target.path}
			defer conn.close()
			mac := hmac.New(sha256.New, key)
			buf := make([]byte, 0, 512)
			for {
				i, more := next()
				if !more {
					break
				}
				var id string
				if ids != nil {
					id = ids(i)
				} else {
					id = prefix + "-" + strconv.Itoa(i)
				}
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
				start := time.Now()
				status, got, err := conn.post(ctx, body, buf)
				now := time.Now()
				if err != nil || status != http.StatusOK || !bytes.Contains(got, okBody) {
					firstErr.CompareAndSwap(nil, fmt.Sprintf("%d %s %v", status, got, err))
					failed.Add(1)
					continue
				}
				if answered != nil {
					answered(i, now)
				}
				ok++
				lat = append(lat, now.Sub(start))
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

// benchRelayUnderLoad runs the receiver and the relay in one child (as the daemon does),
// loads the receiver with -relay-rate signed webhooks per second for -relay-duration, and
// measures for each the time from its 200 answer to the bench reading its record from
// Kafka.
func benchRelayUnderLoad(ctx context.Context, e *env, res *Results) error {
	if err := e.truncate(ctx); err != nil {
		return err
	}
	topic, err := e.topic(ctx, "webhooks", e.o.partitions)
	if err != nil {
		return err
	}
	c, err := e.startChild(ctx, "receiver", childConfig{
		MaxConns: int32(e.o.receiverConns + 2), OutboxTopic: topic, Batch: e.o.maxBatch, Secret: stripeSecret,
		Relay: true, RelayBatch: e.o.relayBatch, ProfileName: "receiver-relay",
	})
	if err != nil {
		return err
	}
	defer c.kill()
	total := int(float64(e.o.relayRate)*e.o.relayDuration.Seconds()) + 1
	answeredAt := make([]atomic.Int64, total+e.o.concurrency+1)
	const prefix = "lat"
	var (
		slow   slowRecords
		warmAt = make([]atomic.Int64, e.o.relayRate+e.o.concurrency+2)
		warmMu sync.Mutex
		warmD  []time.Duration
	)
	lat, stopReaders, err := e.readLatencies(ctx, topic, func(h []kafka.Header, now time.Time) (time.Duration, bool) {
		for _, x := range h {
			if x.Key != outbox.HeaderCausationID {
				continue
			}
			if w, ok := strings.CutPrefix(string(x.Value), "warm-"); ok {
				if i, err := strconv.Atoi(w); err == nil && i >= 0 && i < len(warmAt) && warmAt[i].Load() != 0 {
					warmMu.Lock()
					warmD = append(warmD, max(now.Sub(time.Unix(0, warmAt[i].Load())), 0))
					warmMu.Unlock()
				}
				return 0, false
			}
			i, err := strconv.Atoi(strings.TrimPrefix(string(x.Value), prefix+"-"))
			if err != nil || i < 0 || i >= len(answeredAt) {
				return 0, false
			}
			at := answeredAt[i].Load()
			if at == 0 {
				// Read before the client saw the answer: counted as zero.
				return 0, true
			}
			d := max(now.Sub(time.Unix(0, at)), 0)
			slow.add(time.Unix(0, at), d)
			return d, true
		}
		return 0, false
	})
	if err != nil {
		return err
	}
	// Warm-up, not measured: the child has just started. In phase 5 every record slower
	// than 50 ms was answered in the first 0.04-0.25 s (up to 290 ms late), waiting for the
	// pool's connections; since phase 6 the child opens them before it says ready and the
	// relay its Kafka connections when it leads, as the daemon does, and the first second's
	// p99 is about 40 ms against 15 after it. The goal is the steady state's; the warm-up's
	// own p99 is in the note.
	url := "http://" + c.Ready + "/webhooks/stripe"
	warm, err := e.loadWebhooks(ctx, url, "warm", time.Second, e.o.relayRate, nil, answersInto(warmAt))
	if err != nil {
		stopReaders()
		return err
	}
	checkpoints := e.checkpoints(ctx)
	loadStart := time.Now()
	st, err := e.loadWebhooks(ctx, url, prefix, e.o.relayDuration, e.o.relayRate, nil, answersInto(answeredAt))
	if err != nil {
		stopReaders()
		return err
	}
	got := lat.wait(int(st.ok), 30*time.Second)
	stopReaders()
	cpu, rss, err := e.stopPacedChild(ctx, c, warm, st, "relay under load")
	if err != nil {
		return err
	}
	if got < int(st.ok) {
		return fmt.Errorf("relay under load: %d of %d answered webhooks reached Kafka within 30 s", got, st.ok)
	}
	d := lat.all()
	row := &Row{Section: "relay", Mode: fmt.Sprintf("under receiver load, %d webhooks/s", e.o.relayRate), Count: int(st.ok),
		Seconds: st.elapsed.Seconds(), Rate: float64(st.ok) / st.elapsed.Seconds(), Unit: "webhooks/s",
		P50ms: percentile(d, 0.50), P99ms: percentile(d, 0.99), P999ms: percentile(d, 0.999), PeakRSSMiB: rss, CPU: cpu,
		Note: fmt.Sprintf("latency: 200 answer -> record read from Kafka by the bench; receiver p99 %.1f ms at this rate; %d errors of the bench's Kafka readers; %s",
			st.pct(0.99), lat.readerErrors.Load(), e.latencyNote(ctx, checkpoints)) + "; " + slow.summary(loadStart) +
			fmt.Sprintf("; after a warm-up of 1 s at the same rate, not counted (a fresh child's first second is slower): %d of its %d records read, p99 %.1f ms, worst %.1f ms",
				len(warmD), warm.ok, percentile(warmD, 0.99), percentile(warmD, 1))}
	e.logf("relay under load: %d webhooks, 2xx-to-record p50 %.1f ms p99 %.1f ms p999 %.1f ms", st.ok, row.P50ms, row.P99ms, row.P999ms)
	res.RelayUnderLoad = row
	return nil
}

// stopPacedChild ends a child loaded at a fixed rate after a warm-up (warm, then st): it
// returns the child's CPU per webhook over st and its peak RSS, and checks that every 200
// of both loads is a committed row with its effect (what names the section in the error).
func (e *env) stopPacedChild(ctx context.Context, c *child, warm, st *loadStats, what string) (*CPU, float64, error) {
	cpu := e.cpuPerMessage(ctx, c, int(st.ok))
	rss, err := c.stop()
	if err != nil {
		return nil, 0, err
	}
	var both loadStats
	both.count(warm)
	both.count(st)
	if err := e.checkWebhooks(ctx, webhookCounts{}, &both); err != nil {
		return nil, 0, fmt.Errorf("%s (with its warm-up): %w", what, err)
	}
	return cpu, rss, nil
}

// latencies collects latencies measured by Kafka readers.
type latencies struct {
	mu   sync.Mutex
	d    []time.Duration
	n    atomic.Int64
	more chan struct{}
	// readerErrors counts the errors the Kafka readers logged (a fetch whose answer came
	// too late is one, and costs the reader a reconnection and a backoff).
	readerErrors atomic.Int64
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
	l.n.Add(1)
	select {
	case l.more <- struct{}{}:
	default:
	}
}

// wait waits until n latencies are in, or timeout, and returns how many are.
func (l *latencies) wait(n int, timeout time.Duration) int {
	deadline := time.After(timeout)
	for int(l.n.Load()) < n {
		select {
		case <-l.more:
		case <-deadline:
			return int(l.n.Load())
		}
	}
	return int(l.n.Load())
}

func (l *latencies) all() []time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.d)
}

// readLatencies reads topic (every partition, from the start) until stop is called, and
// records measure's latency for each record it accepts.
func (e *env) readLatencies(ctx context.Context, topic string, measure func([]kafka.Header, time.Time) (time.Duration, bool)) (*latencies, func(), error) {
	l := &latencies{more: make(chan struct{}, 1)}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for p := range e.o.partitions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := kafka.NewReader(kafka.ReaderConfig{
				Brokers: e.brokers, Topic: topic, Partition: p, MinBytes: 1, MaxBytes: 10 << 20,
				// The broker holds a fetch 100 ms; the answer has a second more to come back
				// (consumer.FetchAnswerMargin), so a late answer never costs a reconnection.
				MaxWait: 100*time.Millisecond + consumer.FetchAnswerMargin, ReadBatchTimeout: 100 * time.Millisecond,
				ErrorLogger: kafka.LoggerFunc(func(string, ...any) { l.readerErrors.Add(1) }),
			})
			defer r.Close()
			for {
				m, err := r.ReadMessage(rctx)
				if err != nil {
					return
				}
				if d, ok := measure(m.Headers, time.Now()); ok {
					l.add(d)
				}
			}
		}()
	}
	// Let the readers reach the broker before the first record.
	time.Sleep(500 * time.Millisecond)
	return l, func() { cancel(); wg.Wait() }, nil
}

// slowRecords keeps when the records slower than slowRecord were answered, to tell one
// stall (many records answered within a few hundred milliseconds) from a slow tail.
type slowRecords struct {
	mu sync.Mutex
	at []time.Time
	d  []time.Duration
}

const slowRecord = 50 * time.Millisecond

func (s *slowRecords) add(at time.Time, d time.Duration) {
	if d <= slowRecord {
		return
	}
	s.mu.Lock()
	s.at, s.d = append(s.at, at), append(s.d, d)
	s.mu.Unlock()
}

// summary groups the slow records into bursts (answers less than 200 ms apart) and
// describes the three largest, their times from start.
func (s *slowRecords) summary(start time.Time) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.at) == 0 {
		return "no record slower than 50 ms"
	}
	idx := make([]int, len(s.at))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return s.at[a].Compare(s.at[b]) })
	type burst struct {
		from, to time.Time
		n        int
		worst    time.Duration
	}
	var bursts []burst
	for _, i := range idx {
		if n := len(bursts); n > 0 && s.at[i].Sub(bursts[n-1].to) < 200*time.Millisecond {
			b := &bursts[n-1]
			b.to, b.n, b.worst = s.at[i], b.n+1, max(b.worst, s.d[i])
			continue
		}
		bursts = append(bursts, burst{from: s.at[i], to: s.at[i], n: 1, worst: s.d[i]})
	}
	slices.SortFunc(bursts, func(a, b burst) int { return b.n - a.n })
	out := fmt.Sprintf("%d records slower than 50 ms in %d bursts", len(s.at), len(bursts))
	for i, b := range bursts[:min(3, len(bursts))] {
		sep := ", "
		if i == 0 {
			sep = ": "
		}
		out += fmt.Sprintf("%s%d answered at %.2f-%.2f s (worst %.0f ms)", sep, b.n,
			b.from.Sub(start).Seconds(), b.to.Sub(start).Seconds(), float64(b.worst)/float64(time.Millisecond))
	}
	return out
}

// answersInto is loadWebhooks' answered: it records when webhook i was first answered.
func answersInto(at []atomic.Int64) func(int, time.Time) {
	return func(i int, t time.Time) {
		if i < len(at) {
			at[i].CompareAndSwap(0, t.UnixNano())
		}
	}
}

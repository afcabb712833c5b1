package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemd/idemd/internal/kafkatest"
	"github.com/idemd/idemd/outbox"
)

// effectsDDL is the effect table of the crash tests. It has no unique constraint on
// purpose: a repeated effect must show up as an extra row, not as an error that idemd
// would retry or dead-letter.
const effectsDDL = `CREATE TABLE {s}.effects (message_id text NOT NULL, part int, applied_by text NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT clock_timestamp())`

// checkEffects asserts that effects holds exactly one row per id of want.
func checkEffects(t *testing.T, d *db, unique int) (rows, distinct int) {
	t.Helper()
	rows = d.count(t, "effects")
	distinct = d.int(t, "SELECT count(DISTINCT message_id) FROM {s}.effects")
	require.Equal(t, unique, distinct, "every id has an effect (lost = %d)", unique-distinct)
	require.Equal(t, unique, rows, "no id has two effects (duplicated = %d)", rows-distinct)
	return rows, distinct
}

// messages builds n deliveries of n*4/5 unique ids (20% duplicates, same key, headers and
// body as the first delivery), shuffled. It returns the messages and the unique ids.
func messages(n int, prefix string) ([]kafka.Message, []string) {
	unique := n * 4 / 5
	ids := make([]string, unique)
	msgs := make([]kafka.Message, 0, n)
	mk := func(id string) kafka.Message {
		return kafka.Message{
			Key:     []byte("k-" + id),
			Value:   fmt.Appendf(nil, `{"id":%q,"amount":%d}`, id, len(id)),
			Headers: []kafka.Header{{Key: "message-id", Value: []byte(id)}},
		}
	}
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%06d", prefix, i)
		msgs = append(msgs, mk(ids[i]))
	}
	for len(msgs) < n {
		msgs = append(msgs, mk(ids[rand.IntN(unique)]))
	}
	rand.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	return msgs, ids
}

// thresholds returns k random points in (lo, hi)·total, sorted: the crash moments.
func thresholds(k, total int, lo, hi float64) []int {
	out := make([]int, k)
	for i := range out {
		out[i] = int((lo + rand.Float64()*(hi-lo)) * float64(total))
	}
	slices.Sort(out)
	return out
}

// producedRecords counts the records of a produce request, over every record batch of
// every partition.
func producedRecords(req *kmsg.ProduceRequest) int {
	n := 0
	for _, topic := range req.Topics {
		for _, part := range topic.Partitions {
			for raw := part.Records; len(raw) >= 12; {
				var b kmsg.RecordBatch
				if b.ReadFrom(raw) != nil {
					break
				}
				n += int(b.NumRecords)
				raw = raw[min(len(raw), 12+int(b.Length)):]
			}
		}
	}
	return n
}

// subscriptionFile is a pipelines file with one subscription from in to out, whose effect
// records which process applied it.
func subscriptionFile(t *testing.T, schema, in, out, group string) string {
	return writeFile(t, fmt.Sprintf(`subscriptions:
  - name: crash
    topics: [%[2]s]
    group: %[4]s
    effect: {sql: "INSERT INTO %[1]s.effects (message_id, part, applied_by) VALUES (@message_id, @partition, current_setting('application_name'))"}
    publish: {topic: %[3]s, key: {json: /id}}
`, schema, in, out, group))
}

// checkTopic reads out and asserts one distinct operation id per unique id, each the
// stable id of its message; it returns the records read and the distinct operation ids.
func checkTopic(t *testing.T, brokers []string, topic, pipeline string, ids []string) (records, distinct int) {
	t.Helper()
	recs := kafkatest.ReadAtLeastFrom(t, brokers, topic, len(ids), 60*time.Second, 300*time.Millisecond)
	ops := map[string]string{}
	for _, r := range recs {
		op, cause := kafkatest.Header(r, outbox.HeaderOperationID), kafkatest.Header(r, outbox.HeaderCausationID)
		if prev, ok := ops[op]; ok {
			require.Equal(t, prev, cause, "one operation id, one message")
		}
		ops[op] = cause
	}
	for _, id := range ids {
		op := outbox.OperationID(pipeline, id, 0).String()
		require.Equal(t, id, ops[op], "the record of %s is on the topic with its stable operation id", id)
	}
	require.Len(t, ops, len(ids), "distinct operation ids = unique ids")
	return len(recs), len(ops)
}

// TestConsumerCrashLoop: messages with 20% duplicates on 6 partitions, consumed by one
// idemd killed with SIGKILL at random moments and restarted each time. Effects equal the
// unique ids exactly, every outbox row is published, and the output topic carries one
// distinct operation id per unique id.
func TestConsumerCrashLoop(t *testing.T) {
	t.Parallel()
	n, kills := size(5000, 100000), size(3, 10)
	broker := newBroker(t)
	brokers := broker.ListenAddrs()
	d := newDB(t, effectsDDL)
	in, out := "in-"+d.schema, "out-"+d.schema
	kafkatest.CreateTopicOn(t, brokers, in, 6)
	kafkatest.CreateTopicOn(t, brokers, out, 6)
	msgs, ids := messages(n, "c")

	// The records arrive in kills+1 waves; each wave's consumer is killed at a random
	// moment after its first commit, while it still has records in hand (a batch commits up
	// to 500 records per partition, so progress moves in steps).
	nd := newNode(t, d.schema, subscriptionFile(t, d.schema, in, out, "g-"+d.schema), "consumer,relay,pruner", brokers, nil)
	// Published rows are kept, so that the outbox rows can be counted: one per unique id.
	nd.vars["IDEMD_OUTBOX_KEEP_PUBLISHED"] = "true"
	// The pruner opens an epoch of processed_messages (a partition) every few rounds, so
	// that redeliveries and duplicates land in other epochs than their first delivery and
	// epochs open while claims are in flight: the records, kept 7 days, are never dropped.
	nd.vars["IDEMD_PROCESSED_PARTITION_INTERVAL"] = "300ms"
	nd.vars["IDEMD_PRUNE_INTERVAL"] = "100ms"
	p := nd.startReady()
	w := d.watch(t, "effects", "outbox")
	start := time.Now()
	wave := (len(msgs) + kills) / (kills + 1)
	for i := range kills + 1 {
		before := d.count(t, "effects")
		produce(t, brokers, in, msgs[i*wave:min((i+1)*wave, len(msgs))])
		if i == kills {
			break
		}
		until(t, w, nil, 5*time.Minute, fmt.Sprintf("progress before kill %d", i+1), func() bool { return d.count(t, "effects") > before })
		time.Sleep(time.Duration(rand.IntN(100)) * time.Millisecond)
		p.Kill(t)
		t.Logf("kill %d at %d of %d effects", i+1, d.count(t, "effects"), len(ids))
		p = nd.startReady()
	}
	until(t, w, nil, 5*time.Minute, "every effect and every outbox row published", func() bool {
		return d.count(t, "effects") >= len(ids) && d.count(t, "outbox WHERE published_at IS NULL") == 0
	})
	rows, _ := checkEffects(t, d, len(ids))
	require.Equal(t, len(ids), d.outboxRows(t), "one outbox row per unique id")
	require.Equal(t, len(ids), d.count(t, "processed_messages"))
	// Epochs opened (the pruner drops the empty ones) and epochs holding records.
	var epochs, holding int
	require.NoError(t, d.pool.QueryRow(context.Background(), "SELECT (SELECT max(epoch) FROM "+d.schema+".processed_epochs), (SELECT count(DISTINCT epoch) FROM "+d.schema+".processed_messages)").Scan(&epochs, &holding))
	require.Greater(t, epochs, 10, "epochs opened during the run")
	require.Greater(t, holding, 1, "records in more than one epoch")
	// The consumer's filter of the older epochs' ids (processed.EpochFilter), built again
	// after each epoch opened: its claims skipped the older epochs' lookup for the ids it
	// did not hold, among them the duplicates' first deliveries if it had missed any.
	builds := len(regexp.MustCompile(`built the filter of the older epochs' ids.*records"?[:=][1-9]`).FindAllString(nd.allLogs(), -1))
	require.Greater(t, builds, 3, "filters of the older epochs' ids built with records")
	records, distinct := checkTopic(t, brokers, out, "crash", ids)
	require.Equal(t, 0, p.Stop(t, stopTimeout))
	t.Logf("FIGURES consumer-crash-loop: messages=%d unique=%d duplicates=%d partitions=6 kills=%d epochs_opened=%d epochs_holding_records=%d filters_built=%d effects=%d lost=0 duplicated=0 outbox=%d unpublished=0 records=%d distinct_operation_ids=%d republished=%d took=%s",
		n, len(ids), n-len(ids), kills, epochs, holding, builds, rows, d.outboxRows(t), records, distinct, records-distinct, time.Since(start).Round(time.Second))
}

// receiverFile is a pipelines file with a Stripe source whose effect records its process.
func receiverFile(t *testing.T, schema, publishTopic string) string {
	pub := ""
	if publishTopic != "" {
		pub = fmt.Sprintf("\n    publish: {topic: %s, key: {json: /id}}", publishTopic)
	}
	return writeFile(t, fmt.Sprintf(`sources:
  - name: stripe
    verify: {scheme: stripe, secrets_env: [FAULTS_STRIPE_SECRET]}
    effect:
      sql: "INSERT INTO %[1]s.effects (message_id, applied_by) VALUES (@message_id, current_setting('application_name'))"%[2]s
`, schema, pub))
}

const faultsStripeSecret = "whsec_faults_7f3a9c1e2b"

// webhookBody is the body of the Stripe event id (the same bytes on every retry).
func webhookBody(id string) []byte {
	return fmt.Appendf(nil, `{"id":%q,"object":"event","type":"charge.succeeded","data":{"object":{"id":"ch_%s"}}}`, id, id)
}

// deliverAll sends each id with clients senders, each delivery retried with the same id
// and body until a 2xx; dup of them are delivered once more after their 2xx (a sender's
// duplicate), which must be answered 2xx too. done counts ids answered 2xx.
func deliverAll(t *testing.T, url string, ids []string, clients int, dupEvery int, done *tally, onStatus func(*http.Response)) (attempts int64, statuses map[int]int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	if onStatus != nil {
		client.Transport = observe{http.DefaultTransport, onStatus}
	}
	var (
		mu   sync.Mutex
		all  = map[int]int{}
		next atomic.Int64
		wg   sync.WaitGroup
		errs = make(chan error, clients)
		tot  atomic.Int64
	)
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(ids) {
					return
				}
				body := webhookBody(ids[i])
				sends := 1
				if dupEvery > 0 && i%dupEvery == 0 {
					sends = 2
				}
				for range sends {
					n, st, err := retryUntil2xx(ctx, client, func() *http.Request { return stripeRequest(t, url, faultsStripeSecret, body) })
					tot.Add(int64(n))
					mu.Lock()
					for k, v := range st {
						all[k] += v
					}
					mu.Unlock()
					if err != nil {
						errs <- fmt.Errorf("%s: %w", ids[i], err)
						return
					}
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	return tot.Load(), all
}

// observe lets a test look at every response (status, headers) its client gets.
type observe struct {
	rt http.RoundTripper
	fn func(*http.Response)
}

func (o observe) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := o.rt.RoundTrip(r)
	if err == nil {
		o.fn(resp)
	}
	return resp, err
}

// TestReceiverCrashLoop: senders retry every webhook with the same id until they get a
// 2xx, against an idemd killed with SIGKILL again and again. Every id has exactly one
// effect; every duplicate delivery after a 2xx is answered 2xx without an effect.
func TestReceiverCrashLoop(t *testing.T) {
	t.Parallel()
	n, kills := size(2000, 20000), size(4, 12)
	d := newDB(t, effectsDDL)
	nd := newNode(t, d.schema, receiverFile(t, d.schema, ""), "receiver", nil,
		map[string]string{"FAULTS_STRIPE_SECRET": faultsStripeSecret})
	p := nd.startReady()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("evt_rcl_%06d", i)
	}
	var done tally
	type result struct {
		attempts int64
		statuses map[int]int
	}
	res := make(chan result, 1)
	start := time.Now()
	go func() {
		a, s := deliverAll(t, "http://"+nd.httpAddr+"/webhooks/stripe", ids, 16, 5, &done, nil)
		res <- result{a, s}
	}()
	for i, at := range thresholds(kills, n, 0.05, 0.9) {
		done.waitFor(t, 3*time.Minute, fmt.Sprintf("%d ids answered before kill %d", at, i+1), int64(at))
		p.Kill(t)
		p = nd.start() // not waiting: senders meet refused connections and retry
	}
	r := <-res
	nd.waitReady(p)
	rows, _ := checkEffects(t, d, n)
	require.Equal(t, n, d.count(t, "processed_messages"))
	require.Equal(t, 0, p.Stop(t, stopTimeout))
	t.Logf("FIGURES receiver-crash-loop: ids=%d duplicate_deliveries=%d kills=%d attempts=%d statuses=%v effects=%d lost=0 duplicated=0 took=%s",
		n, n/5, kills, r.attempts, r.statuses, rows, time.Since(start).Round(time.Second))
}

// TestRelayKilledBetweenPublishAndMark: a backlog of outbox rows published by a relay-only
// idemd killed with SIGKILL by the broker as a produce request arrives (the records are
// stored, the process never sees the acknowledgement), restarted each time. Records published but
// not yet marked are published again, with the same operation id; none is lost.
//
// The broker chooses the moment: it counts the records it is sent, and kill i comes with the
// first produce request that takes the count past its threshold. A relay that marks its rows
// faster than the test can poll the table still meets every kill with rows in flight.
func TestRelayKilledBetweenPublishAndMark(t *testing.T) {
	t.Parallel()
	n, kills := size(40000, 100000), size(3, 10)
	broker := newBroker(t)
	brokers := broker.ListenAddrs()
	var (
		armed    atomic.Pointer[proc]
		sent     atomic.Int64 // records in the produce requests so far, copies included
		killAt   atomic.Int64 // the count that arms the next kill; 0 when none is armed
		killedAt atomic.Int64 // the count when the last kill was signalled
	)
	broker.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		seen := sent.Add(int64(producedRecords(req.(*kmsg.ProduceRequest))))
		if at := killAt.Load(); at > 0 && seen >= at {
			if p := armed.Swap(nil); p != nil {
				killAt.Store(0)
				killedAt.Store(seen)
				_ = p.Signal(syscall.SIGKILL)
			}
		}
		return nil, nil, false
	})
	d := newDB(t, "")
	topic := "relay-" + d.schema
	kafkatest.CreateTopicOn(t, brokers, topic, 6)
	file := writeFile(t, "sources:\n  - name: unused\n    verify: {scheme: stripe, secrets_env: [FAULTS_STRIPE_SECRET]}\n")
	nd := newNode(t, d.schema, file, "relay", brokers, map[string]string{"FAULTS_STRIPE_SECRET": faultsStripeSecret})

	// Migrate through the binary, then write the backlog as a library user would.
	nd.vars["IDEMD_ROLES"] = "receiver"
	p := nd.startReady()
	require.Equal(t, 0, p.Stop(t, stopTimeout))
	nd.vars["IDEMD_ROLES"] = "relay"
	w := d.watch(t, "outbox")
	ids := make([]string, n)
	store := outbox.New(&outbox.Config{Schema: d.schema})
	ctx := context.Background()
	for i := 0; i < n; i += 1000 {
		tx, err := d.pool.Begin(ctx)
		require.NoError(t, err)
		for j := i; j < min(i+1000, n); j++ {
			ids[j] = fmt.Sprintf("op-%06d", j)
			require.NoError(t, store.EnqueueTx(ctx, tx, outbox.Event{
				Topic: topic, Key: []byte(ids[j]), Payload: fmt.Appendf(nil, `{"n":%d}`, j),
				Pipeline: "relaytest", CausationID: ids[j],
			}))
		}
		require.NoError(t, tx.Commit(ctx))
	}

	start := time.Now()
	// Published rows are deleted (or, with IDEMD_OUTBOX_KEEP_PUBLISHED, moved): what is
	// not waiting any more was published.
	published := func() int { return n - d.count(t, "outbox WHERE published_at IS NULL") }
	p = nd.start()
	for i, at := range thresholds(kills, n, 0.05, 0.85) {
		// The broker kills the relay with the produce request that takes its count past at,
		// then stores the records: they are published, and their rows can never be marked by
		// this process. Every row is sent at least once, so the count passes at < n.
		armed.Store(p)
		killAt.Store(int64(at))
		select {
		case <-p.Done():
		case <-time.After(3 * time.Minute):
			t.Fatalf("kill %d: the broker was sent %d records, not the %d that arm it", i+1, sent.Load(), at)
		}
		p.Kill(t)
		t.Logf("kill %d at %d records sent, with %d of %d rows marked", i+1, killedAt.Load(), published(), n)
		p = nd.start()
	}
	until(t, w, nil, 3*time.Minute, "every outbox row published", func() bool { return published() == n })

	recs := kafkatest.ReadAtLeastFrom(t, brokers, topic, n, 60*time.Second, 300*time.Millisecond)
	byCause := map[string]map[string]int{}
	for _, r := range recs {
		c := kafkatest.Header(r, outbox.HeaderCausationID)
		if byCause[c] == nil {
			byCause[c] = map[string]int{}
		}
		byCause[c][kafkatest.Header(r, outbox.HeaderOperationID)]++
	}
	republished := 0
	for i, id := range ids {
		ops := byCause[id]
		require.Len(t, ops, 1, "row %d: every copy carries the same operation id", i)
		want := outbox.OperationID("relaytest", id, 0).String()
		require.Contains(t, ops, want, "row %d: its stable operation id", i)
		republished += ops[want] - 1
	}
	require.Len(t, byCause, n, "no row lost")
	require.GreaterOrEqual(t, republished, kills, "every kill left published, unmarked records that were published again")
	require.Equal(t, 0, p.Stop(t, stopTimeout))
	t.Logf("FIGURES relay-kill: rows=%d kills=%d records=%d distinct_operation_ids=%d republished=%d lost=0 took=%s",
		n, kills, len(recs), len(byCause), republished, time.Since(start).Round(time.Second))
}

// TestConsumerGroupMemberKilled: three idemd processes in one consumer group on a
// 6-partition topic; the one that applied most is killed with SIGKILL mid-stream and not
// restarted. Its partitions move to the others; effects stay exactly once.
func TestConsumerGroupMemberKilled(t *testing.T) {
	t.Parallel()
	n := size(6000, 60000)
	broker := newBroker(t)
	brokers := broker.ListenAddrs()
	d := newDB(t, effectsDDL)
	in, out := "in-"+d.schema, "out-"+d.schema
	kafkatest.CreateTopicOn(t, brokers, in, 6)
	kafkatest.CreateTopicOn(t, brokers, out, 6)
	file := subscriptionFile(t, d.schema, in, out, "g-"+d.schema)
	var nodes []*node
	var procs []*proc
	for range 3 {
		nd := newNode(t, d.schema, file, "consumer,relay", brokers, nil)
		nodes = append(nodes, nd)
		procs = append(procs, nd.start())
	}
	for i, nd := range nodes {
		nd.waitReady(procs[i])
	}
	w := d.watch(t, "effects", "outbox")
	msgs, ids := messages(n, "g")
	// Produce over a few seconds so that the group has settled and every member works.
	start := time.Now()
	produced := make(chan struct{})
	go func() {
		defer close(produced)
		step := max(len(msgs)/20, 1)
		for i := 0; i < len(msgs); i += step {
			produce(t, brokers, in, msgs[i:min(i+step, len(msgs))])
			time.Sleep(200 * time.Millisecond)
		}
	}()
	until(t, w, nil, 3*time.Minute, "a third of the effects, from all three members", func() bool {
		return d.count(t, "effects") >= len(ids)/3 && d.int(t, "SELECT count(DISTINCT applied_by) FROM {s}.effects") == 3
	})
	var victim int
	var best int
	for i, nd := range nodes {
		c := d.int(t, fmt.Sprintf("SELECT count(*) FROM {s}.effects WHERE applied_by = '%s'", nd.name))
		if c > best {
			victim, best = i, c
		}
	}
	var parts []int32
	// The victim's partitions now: those whose latest effect it applied.
	rows, err := d.pool.Query(context.Background(), fmt.Sprintf(`SELECT part FROM (
  SELECT DISTINCT ON (part) part, applied_by FROM %s.effects ORDER BY part, applied_at DESC) last
WHERE applied_by = $1 ORDER BY 1`, d.schema), nodes[victim].name)
	require.NoError(t, err)
	for rows.Next() {
		var p int32
		require.NoError(t, rows.Scan(&p))
		parts = append(parts, p)
	}
	require.NoError(t, rows.Err())
	procs[victim].Kill(t)
	killedAt := time.Now()
	t.Logf("killed %s after %d effects; it had partitions %v", nodes[victim].name, best, parts)
	<-produced
	until(t, w, nil, 5*time.Minute, "every effect and every outbox row published", func() bool {
		return d.count(t, "effects") >= len(ids) && d.count(t, "outbox WHERE published_at IS NULL") == 0
	})
	total, _ := checkEffects(t, d, len(ids))
	// The victim's partitions were consumed by the survivors after the kill.
	partList := make([]string, len(parts))
	for i, p := range parts {
		partList[i] = fmt.Sprint(p)
	}
	moved := d.int(t, fmt.Sprintf(`SELECT count(DISTINCT part) FROM {s}.effects WHERE applied_by <> '%s'
  AND applied_at > '%s' AND part IN (%s)`,
		nodes[victim].name, killedAt.Format(time.RFC3339Nano), strings.Join(append(partList, "-1"), ",")))
	require.Positive(t, moved, "the killed member's partitions moved to the survivors")
	records, distinct := checkTopic(t, brokers, out, "crash", ids)
	for i, nd := range nodes {
		if i != victim {
			require.Equal(t, 0, procs[i].Stop(t, stopTimeout), nd.name)
		}
	}
	t.Logf("FIGURES group-kill: messages=%d unique=%d members=3 killed=1 victim_effects=%d victim_partitions=%v partitions_moved=%d effects=%d lost=0 duplicated=0 records=%d distinct_operation_ids=%d took=%s",
		n, len(ids), best, parts, moved, total, records, distinct, time.Since(start).Round(time.Second))
}

package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/Admiral-Piett/goaws/app/models"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/sirupsen/logrus"

	"github.com/idemd/idemd/internal/brokerenv"
	"github.com/idemd/idemd/internal/sqsfake"
	"github.com/idemd/idemd/outbox"
)

// The brokers section: idemd's Pub/Sub and SQS subscriptions on the in-process fakes the
// tests use (Google's pstest, goaws v0.5.4 through internal/sqsfake), each beside the SQL
// limit of the same run and beside the fastest broker-only client the bench knows on the same
// fake with the same messages (receive and acknowledge, no database): how much of the gap
// is the fake broker's own ceiling.
//
// Every run is timed alike, by the broker: from the first acknowledgement it receives to the
// last (Pub/Sub: the Acknowledge calls, seen by a pstest reactor; SQS: the queue's depth in
// goaws, read every 2 ms), counting the messages acknowledged after the first one, as the
// Kafka consumer is timed from its first offset commit to its last.

// brokerProject is the Pub/Sub project of the bench's topics and subscriptions.
const brokerProject = "idemd-bench"

// brokerFakes are the fakes of one brokers section, in the bench process.
type brokerFakes struct {
	pubsub *pstest.Server
	acks   *ackWatcher
	sqs    *sqsfake.Server
	// env points the official clients at the fakes (brokerenv's variables), in this
	// process and in the idemd child.
	env     map[string]string
	clients *brokerenv.Clients
}

func startBrokerFakes(ctx context.Context) (*brokerFakes, error) {
	// goaws logs every message it takes at info level, through logrus's standard logger.
	logrus.SetLevel(logrus.WarnLevel)
	f := &brokerFakes{acks: &ackWatcher{subs: map[string]*ackWatch{}}}
	f.pubsub = pstest.NewServer(pstest.ServerReactorOption{FuncName: "Acknowledge", Reactor: f.acks})
	s, err := sqsfake.Start("127.0.0.1:0")
	if err != nil {
		_ = f.pubsub.Close()
		return nil, fmt.Errorf("starting the fake SQS: %w", err)
	}
	f.sqs = s
	f.env = map[string]string{
		"PUBSUB_EMULATOR_HOST": f.pubsub.Addr, "PUBSUB_PROJECT_ID": brokerProject,
		"AWS_ENDPOINT_URL_SQS": s.URL(), "AWS_REGION": sqsfake.Region,
		"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
	}
	f.clients = brokerenv.New(func(name string) (string, bool) { v, ok := f.env[name]; return v, ok })
	if _, err := f.clients.SQS(ctx); err != nil {
		f.close()
		return nil, err
	}
	return f, nil
}

func (f *brokerFakes) close() {
	_ = f.clients.Close()
	_ = f.pubsub.Close()
	_ = f.sqs.Close()
}

// ackWatcher is a pstest reactor on Acknowledge: it sees every acknowledgement of the
// watched subscriptions and lets the call go on to the fake.
type ackWatcher struct {
	mu   sync.Mutex
	subs map[string]*ackWatch
}

// ackWatch follows the acknowledgements of one subscription (or one SQS queue's depth).
type ackWatch struct {
	want int
	// acked are the distinct message ids acknowledged (Pub/Sub ack ids are id:delivery).
	acked   map[string]bool
	first   time.Time
	atFirst int
	end     time.Time
	done    chan struct{}
}

func newAckWatch(want int) *ackWatch {
	return &ackWatch{want: want, acked: map[string]bool{}, done: make(chan struct{})}
}

// progress records that n messages are acknowledged by now.
func (w *ackWatch) progress(n int, now time.Time) {
	if n > 0 && w.first.IsZero() {
		w.first, w.atFirst = now, n
	}
	if n >= w.want && w.end.IsZero() {
		w.end = now
		close(w.done)
	}
}

// window is what the watch saw: the messages acknowledged after the first
// acknowledgement, and from it to the last.
func (w *ackWatch) window() (int, time.Duration) { return w.want - w.atFirst, w.end.Sub(w.first) }

func (a *ackWatcher) watch(subscription string, want int) *ackWatch {
	w := newAckWatch(want)
	a.mu.Lock()
	a.subs[subscription] = w
	a.mu.Unlock()
	return w
}

func (a *ackWatcher) forget(subscription string) {
	a.mu.Lock()
	delete(a.subs, subscription)
	a.mu.Unlock()
}

// React counts the acknowledged messages of a watched subscription (pstest.Reactor).
func (a *ackWatcher) React(req any) (bool, any, error) {
	r, ok := req.(*pubsubpb.AcknowledgeRequest)
	if !ok {
		return false, nil, nil
	}
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	w := a.subs[r.Subscription]
	if w == nil {
		return false, nil, nil
	}
	for _, id := range r.AckIds {
		if i := strings.LastIndexByte(id, ':'); i > 0 {
			id = id[:i]
		}
		w.acked[id] = true
	}
	w.progress(len(w.acked), now)
	return false, nil, nil
}

// watchSQS follows the depth of a goaws queue (its messages, visible or not, read from
// goaws's own table in this process: no request that would load the fake) until it is
// empty, every 2 ms.
func watchSQS(ctx context.Context, queue string, want int) *ackWatch {
	w := newAckWatch(want)
	go func() {
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		for w.end.IsZero() {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			models.SyncQueues.RLock()
			q := models.SyncQueues.Queues[queue]
			depth := want
			if q != nil {
				depth = len(q.Messages)
			}
			models.SyncQueues.RUnlock()
			w.progress(want-depth, time.Now())
		}
	}()
	return w
}

// benchBrokers measures, for Pub/Sub and then SQS: idemd's subscription (in a child, relay
// running, as the Kafka consumer row) and the broker-only client(s), each on fresh copies of
// the same messages.
func benchBrokers(ctx context.Context, e *env, res *Results) error {
	f, err := startBrokerFakes(ctx)
	if err != nil {
		return err
	}
	defer f.close()
	add := func(r *Row, out **Row) {
		r.Section = "brokers"
		res.Brokers = append(res.Brokers, r)
		if out != nil && (*out == nil || r.Rate > (*out).Rate) {
			*out = r
		}
	}
	doors := strings.Split(e.o.brokerDoors, ",")
	if slices.Contains(doors, "pubsub") {
		recs, unique := records("evt-"+e.runID+"-pubsub", e.o.pubsubMessages, 1)
		row, err := e.runBrokerIdemd(ctx, f, "pubsub", recs, unique, 0)
		if err != nil {
			return fmt.Errorf("idemd Pub/Sub: %w", err)
		}
		add(row, &res.PubSub)
		for _, streams := range []int{1, 8} {
			base, err := e.runPubSubOnly(ctx, f, recs, streams)
			if err != nil {
				return fmt.Errorf("Pub/Sub broker-only, %d streams: %w", streams, err)
			}
			add(base, &res.PubSubOnly)
		}
	}
	if !slices.Contains(doors, "sqs") {
		return nil
	}
	recs, unique := records("evt-"+e.runID+"-sqs", e.o.brokerMessages, 1)
	// The default lease (30 s), as the daemon runs; then 2 s, which bounds the stall a
	// lost ReceiveMessage answer causes (BENCHMARKS.md).
	for _, lease := range []time.Duration{0, 2 * time.Second} {
		row, err := e.runBrokerIdemd(ctx, f, "sqs", recs, unique, lease)
		if err != nil {
			return fmt.Errorf("idemd SQS: %w", err)
		}
		add(row, nil)
		if lease == 0 {
			res.SQS = row
		} else {
			res.SQSShortLease = row
		}
	}
	for _, n := range e.o.sqsPollers {
		base, err := e.runSQSOnly(ctx, f, recs, n)
		if err != nil {
			return fmt.Errorf("SQS broker-only, %d pollers: %w", n, err)
		}
		add(base, &res.SQSOnly)
	}
	return nil
}

// pubsubTopic creates a topic and its unordered subscription (ack deadline 60 s), and
// publishes recs on it through the client's Publisher, each with its operation-id attribute.
func (e *env) pubsubTopic(ctx context.Context, f *brokerFakes, recs []record) (sub string, err error) {
	e.seq++
	id := fmt.Sprintf("bench-%s-%d", e.runID, e.seq)
	topic, sub := "projects/"+brokerProject+"/topics/"+id, "projects/"+brokerProject+"/subscriptions/"+id
	cl, err := f.clients.PubSub(ctx, "")
	if err != nil {
		return "", err
	}
	if _, err := cl.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: topic}); err != nil {
		return "", fmt.Errorf("creating topic %s: %w", topic, err)
	}
	if _, err := cl.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{Name: sub, Topic: topic, AckDeadlineSeconds: 60}); err != nil {
		return "", fmt.Errorf("creating subscription %s: %w", sub, err)
	}
	p := cl.Publisher(topic)
	defer p.Stop()
	results := make([]*pubsub.PublishResult, len(recs))
	for i, r := range recs {
		results[i] = p.Publish(ctx, &pubsub.Message{Data: r.body, Attributes: map[string]string{outbox.HeaderOperationID: r.id}})
	}
	for i, r := range results {
		if _, err := r.Get(ctx); err != nil {
			return "", fmt.Errorf("publishing message %d on %s: %w", i, topic, err)
		}
	}
	return sub, nil
}

// dropPubSub deletes the subscription and its topic and forgets every message the fake kept.
func (e *env) dropPubSub(ctx context.Context, f *brokerFakes, sub string) {
	f.acks.forget(sub)
	if cl, err := f.clients.PubSub(ctx, ""); err == nil {
		_ = cl.SubscriptionAdminClient.DeleteSubscription(ctx, &pubsubpb.DeleteSubscriptionRequest{Subscription: sub})
		_ = cl.TopicAdminClient.DeleteTopic(ctx, &pubsubpb.DeleteTopicRequest{Topic: strings.Replace(sub, "/subscriptions/", "/topics/", 1)})
	}
	f.pubsub.ClearMessages()
}

// sqsQueue creates a standard queue (visibility 60 s) and sends recs to it with
// SendMessageBatch, ten at a time from 8 senders, each with its operation-id attribute.
func (e *env) sqsQueue(ctx context.Context, f *brokerFakes, recs []record) (name, url string, err error) {
	e.seq++
	name = fmt.Sprintf("bench-%s-%d", e.runID, e.seq)
	cl, err := f.clients.SQS(ctx)
	if err != nil {
		return "", "", err
	}
	out, err := cl.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: map[string]string{"VisibilityTimeout": "60"}})
	if err != nil {
		return "", "", fmt.Errorf("creating queue %s: %w", name, err)
	}
	url = aws.ToString(out.QueueUrl)
	chunks := make(chan []record)
	errc := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for chunk := range chunks {
				entries := make([]types.SendMessageBatchRequestEntry, len(chunk))
				for i, r := range chunk {
					entries[i] = types.SendMessageBatchRequestEntry{
						Id: aws.String(strconv.Itoa(i)), MessageBody: aws.String(string(r.body)),
						MessageAttributes: map[string]types.MessageAttributeValue{
							outbox.HeaderOperationID: {DataType: aws.String("String"), StringValue: aws.String(r.id)},
						},
					}
				}
				out, err := cl.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(url), Entries: entries})
				if err == nil && len(out.Failed) > 0 {
					err = fmt.Errorf("%d entries failed: %s", len(out.Failed), aws.ToString(out.Failed[0].Message))
				}
				if err != nil {
					errc <- fmt.Errorf("sending to %s: %w", name, err)
					for range chunks {
					}
					return
				}
			}
		})
	}
	for start := 0; start < len(recs); start += 10 {
		chunks <- recs[start:min(start+10, len(recs))]
	}
	close(chunks)
	wg.Wait()
	close(errc)
	return name, url, <-errc
}

func (e *env) dropSQS(ctx context.Context, f *brokerFakes, url string) {
	if cl, err := f.clients.SQS(ctx); err == nil {
		_, _ = cl.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: aws.String(url)})
	}
}

// runBrokerIdemd publishes recs to a fresh subscription or queue and consumes it with
// idemd's subscription in a child process (message_id: {attribute: operation-id}, the SQL
// effect and a Kafka publish target, the relay running), timed by the broker, and checks one
// effect and one event per distinct id.
func (e *env) runBrokerIdemd(ctx context.Context, f *brokerFakes, door string, recs []record, unique int, lease time.Duration) (*Row, error) {
	if err := e.truncate(ctx); err != nil {
		return nil, err
	}
	before, err := e.outboxMax(ctx)
	if err != nil {
		return nil, err
	}
	cfg := childConfig{MaxConns: 8, Batch: e.o.batch, Relay: true, RelayBatch: e.o.relayBatch, BrokerEnv: f.env, IDAttribute: outbox.HeaderOperationID, Lease: lease}
	var (
		w     *ackWatch
		label string
		drop  func()
	)
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	switch door {
	case "pubsub":
		sub, err := e.pubsubTopic(ctx, f, recs)
		if err != nil {
			return nil, err
		}
		drop = func() { e.dropPubSub(ctx, f, sub) }
		cfg.PubSubSubscription, label = sub, "Pub/Sub subscription"
		w = f.acks.watch(sub, len(recs))
	default:
		name, url, err := e.sqsQueue(ctx, f, recs)
		if err != nil {
			return nil, err
		}
		drop = func() { e.dropSQS(ctx, f, url) }
		cfg.SQSQueue, label = name, "SQS standard queue"
		w = watchSQS(wctx, name, len(recs))
	}
	defer drop()
	outTopic, err := e.topic(ctx, fmt.Sprintf("ledger-%s-%d", door, e.seq), e.o.partitions)
	if err != nil {
		return nil, err
	}
	cfg.OutboxTopic = outTopic
	cfg.ProfileName = fmt.Sprintf("brokers-%s-batch%d", door, e.o.batch)
	e.logf("brokers: idemd %s on %d messages", label, len(recs))
	c, err := e.startChild(ctx, "consumer", cfg)
	if err != nil {
		return nil, err
	}
	begin := time.Now()
	select {
	case <-w.done:
	case <-ctx.Done():
		c.kill()
		return nil, ctx.Err()
	case <-time.After(10 * time.Minute):
		c.kill()
		return nil, fmt.Errorf("%s: not every message acknowledged within 10 minutes", label)
	}
	counted, window := w.window()
	cpu := e.cpuPerMessage(ctx, c, len(recs))
	rss, err := e.checkOnce(ctx, c, before, outTopic, e.o.partitions, unique, true)
	if err != nil {
		return nil, err
	}
	rate := float64(counted) / window.Seconds()
	total := w.end.Sub(begin)
	name := fmt.Sprintf("idemd %s, BatchSize %d, relay running", label, e.o.batch)
	if lease > 0 {
		name += fmt.Sprintf(", lease %s", lease)
	}
	e.logf("brokers: %s: %d msgs in %s: %.0f msgs/s (all %d in %s from child start), peak RSS %.1f MiB", name, counted, window.Round(time.Millisecond), rate, len(recs), total.Round(time.Millisecond), rss)
	return &Row{Mode: name, Count: counted, Seconds: window.Seconds(), Rate: rate, Unit: "msgs/s", PeakRSSMiB: rss, CPU: cpu,
		Note: fmt.Sprintf("%d messages, %d distinct operation-id attributes (%d repeats, each a new broker message); message_id: {attribute: operation-id}; each effect and outbox row once; rate from the first acknowledgement the fake received to the last (all %d from child start: %.0f msgs/s)",
			len(recs), unique, len(recs)-unique, len(recs), float64(len(recs))/total.Seconds())}, nil
}

// pubsubOnlyOutstanding is the broker-only Pub/Sub client's flow control: the client's
// default, and what idemd's source asks at BatchSize 500.
const pubsubOnlyOutstanding = 1000

// runPubSubOnly receives a fresh copy of recs with the official client's streaming pull
// (Subscriber.Receive on streams streaming pulls: NumGoroutines, whose default, 1, idemd's
// source keeps) and acknowledges each message in the callback: no database.
func (e *env) runPubSubOnly(ctx context.Context, f *brokerFakes, recs []record, streams int) (*Row, error) {
	sub, err := e.pubsubTopic(ctx, f, recs)
	if err != nil {
		return nil, err
	}
	defer e.dropPubSub(ctx, f, sub)
	cl, err := f.clients.PubSub(ctx, "")
	if err != nil {
		return nil, err
	}
	w := f.acks.watch(sub, len(recs))
	s := cl.Subscriber(sub)
	s.ReceiveSettings.MaxOutstandingMessages = pubsubOnlyOutstanding
	s.ReceiveSettings.NumGoroutines = streams
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	self := selfCPU()
	errc := make(chan error, 1)
	go func() { errc <- s.Receive(rctx, func(_ context.Context, m *pubsub.Message) { m.Ack() }) }()
	if err := waitAcks(ctx, w, errc); err != nil {
		return nil, err
	}
	cpu := selfCPU() - self
	cancel()
	<-errc
	name := fmt.Sprintf("broker-only Pub/Sub client: %d streaming pull(s) + Ack, MaxOutstandingMessages %d", streams, pubsubOnlyOutstanding)
	return e.brokerOnlyRow(name, w, len(recs), cpu), nil
}

// runSQSOnly receives a fresh copy of recs with pollers concurrent ReceiveMessage calls (10
// messages, long polling) and deletes each answer with one DeleteMessageBatch: no database.
func (e *env) runSQSOnly(ctx context.Context, f *brokerFakes, recs []record, pollers int) (*Row, error) {
	name, url, err := e.sqsQueue(ctx, f, recs)
	if err != nil {
		return nil, err
	}
	defer e.dropSQS(ctx, f, url)
	cl, err := f.clients.SQS(ctx)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := watchSQS(rctx, name, len(recs))
	self := selfCPU()
	errc := make(chan error, 1)
	var wg sync.WaitGroup
	for range pollers {
		wg.Go(func() {
			for rctx.Err() == nil {
				out, err := cl.ReceiveMessage(rctx, &sqs.ReceiveMessageInput{
					QueueUrl: aws.String(url), MaxNumberOfMessages: 10, WaitTimeSeconds: 1,
					MessageAttributeNames: []string{"All"},
				})
				if err == nil && len(out.Messages) > 0 {
					entries := make([]types.DeleteMessageBatchRequestEntry, len(out.Messages))
					for i, m := range out.Messages {
						entries[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle}
					}
					_, err = cl.DeleteMessageBatch(rctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(url), Entries: entries})
				}
				if err != nil && rctx.Err() == nil {
					select {
					case errc <- err:
					default:
					}
					return
				}
			}
		})
	}
	err = waitAcks(ctx, w, errc)
	cpu := selfCPU() - self
	cancel()
	wg.Wait()
	if err != nil {
		return nil, err
	}
	mode := fmt.Sprintf("broker-only SQS client: %d pollers, ReceiveMessage 10 + DeleteMessageBatch", pollers)
	return e.brokerOnlyRow(mode, w, len(recs), cpu), nil
}

// waitAcks waits until w saw every message acknowledged, or the client failed.
func waitAcks(ctx context.Context, w *ackWatch, errc <-chan error) error {
	select {
	case <-w.done:
		return nil
	case err := <-errc:
		return cmpErr(err, errors.New("the client stopped before every message was acknowledged"))
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(10 * time.Minute):
		return errors.New("not every message acknowledged within 10 minutes")
	}
}

func (e *env) brokerOnlyRow(mode string, w *ackWatch, n int, cpu time.Duration) *Row {
	counted, window := w.window()
	rate := float64(counted) / window.Seconds()
	e.logf("brokers: %s: %d msgs in %s: %.0f msgs/s", mode, counted, window.Round(time.Millisecond), rate)
	return &Row{Mode: mode, Count: counted, Seconds: window.Seconds(), Rate: rate, Unit: "msgs/s",
		CPU:  &CPU{GeneratorUs: float64(cpu.Microseconds()) / float64(n)},
		Note: "no database; the client and the fake share the bench process (CPU: both); timed as idemd, from the first acknowledgement the fake received to the last"}
}

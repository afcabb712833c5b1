package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/internal/kafkatest"
	"github.com/idemd/idemd/internal/metrics"
	"github.com/idemd/idemd/internal/metricstest"
	"github.com/idemd/idemd/internal/outageproxy"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/internal/pubsubtest"
	"github.com/idemd/idemd/internal/sqsfake"
	"github.com/idemd/idemd/internal/sqstest"
	"github.com/idemd/idemd/internal/tracing"
	"github.com/idemd/idemd/outbox"
)

// The relay's Pub/Sub and SQS destinations, against pstest and goaws through the official
// clients, and PostgreSQL.

const tracedParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// brokerEvents returns n events to dest over keys, payload "<prefix>:<key>:<seq>" with seq
// counting per key (requireKeyOrder reads them), each with a traceparent and an event type.
func brokerEvents(dest, prefix string, n int, keys ...string) []outbox.Event {
	out := make([]outbox.Event, n)
	for i := range out {
		k := keys[i%len(keys)]
		out[i] = outbox.Event{Topic: dest, Key: []byte(k), Payload: fmt.Appendf(nil, "%s:%s:%04d", prefix, k, i/len(keys)),
			Pipeline: "p", CausationID: fmt.Sprintf("%s-%d", prefix, i),
			Headers: map[string]string{outbox.HeaderEventType: "order.paid", "traceparent": tracedParent}}
	}
	return out
}

// sentEntry is one SQS entry as the relay sent it.
type sentEntry struct {
	body, group, dedup string
}

// recordingSQS is the real SQS client with a record of the entries of every
// SendMessageBatch it sent: goaws does not return MessageGroupId nor
// MessageDeduplicationId on receive.
type recordingSQS struct {
	*sqs.Client
	mu   sync.Mutex
	sent []sentEntry
}

func (c *recordingSQS) SendMessageBatch(ctx context.Context, in *sqs.SendMessageBatchInput, opts ...func(*sqs.Options)) (*sqs.SendMessageBatchOutput, error) {
	c.mu.Lock()
	for _, e := range in.Entries {
		c.sent = append(c.sent, sentEntry{aws.ToString(e.MessageBody), aws.ToString(e.MessageGroupId), aws.ToString(e.MessageDeduplicationId)})
	}
	c.mu.Unlock()
	return c.Client.SendMessageBatch(ctx, in, opts...)
}

func (c *recordingSQS) entries() []sentEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]sentEntry(nil), c.sent...)
}

// brokerRelay is a relay bundle with publishers on the tests' Pub/Sub and SQS.
type brokerRelay struct {
	*relayBundle
	pubsub *outbox.PubSubPublisher
	sqs    *recordingSQS
}

func setupBrokerRelay(t *testing.T, psClient *pubsub.Client, sqsClient *sqs.Client) *brokerRelay {
	t.Helper()
	db := pgtest.New(t)
	b := &brokerRelay{relayBundle: &relayBundle{db: db, store: outbox.New(&outbox.Config{Schema: db.Schema})}}
	ps, err := outbox.NewPubSubPublisher(psClient, &outbox.PubSubPublisherConfig{Timeout: 2 * time.Second})
	require.NoError(t, err)
	b.pubsub = ps
	b.sqs = &recordingSQS{Client: sqsClient}
	return b
}

// config is a relay configuration with both publishers and no Kafka.
func (b *brokerRelay) config() outbox.RelayConfig {
	p, _ := outbox.NewSQSPublisher(b.sqs)
	return outbox.RelayConfig{PubSub: b.pubsub, SQS: p, BackoffMin: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond}
}

// pullAll pulls an ordered subscription (pubsubtest.SubscriptionConfig{Ordered: true}),
// acknowledging what it pulled, until it received want distinct operation ids and at least
// total messages, and returns them in the order received: pstest hands out a key's next
// message once the previous one is acknowledged, so that order is each key's publish order.
func pullAll(t *testing.T, sub string, want, total int) []*pubsubpb.PubsubMessage {
	t.Helper()
	c := pubsubtest.Client(t)
	var out []*pubsubpb.PubsubMessage
	ops := map[string]bool{}
	deadline := time.Now().Add(30 * time.Second)
	for len(ops) < want || len(out) < total {
		require.False(t, time.Now().After(deadline), "%d messages (%d operation ids) pulled from %s, want %d (%d)", len(out), len(ops), sub, total, want)
		got := pubsubtest.Pull(t, sub, 100)
		var acks []string
		for _, m := range got {
			out = append(out, m.Message)
			ops[m.Message.Attributes[outbox.HeaderOperationID]] = true
			acks = append(acks, m.AckId)
		}
		if len(acks) > 0 {
			require.NoError(t, c.SubscriptionAdminClient.Acknowledge(context.Background(), &pubsubpb.AcknowledgeRequest{Subscription: sub, AckIds: acks}))
		}
	}
	return out
}

// orderedTopic creates a topic and an ordered subscription on it (for pullAll).
func orderedTopic(t *testing.T) (topic, sub string) {
	t.Helper()
	topic = pubsubtest.Topic(t)
	return topic, pubsubtest.Subscription(t, topic, pubsubtest.SubscriptionConfig{Ordered: true})
}

// receiveFIFO reads n messages of a FIFO queue of one group in order, deleting each (goaws
// hands out a group's next message once the previous one is deleted).
func receiveFIFO(t *testing.T, url string, n int) []types.Message {
	t.Helper()
	var out []types.Message
	for len(out) < n {
		got := sqstest.ReceiveN(t, url, 1, 20*time.Second)
		out = append(out, got...)
		sqstest.Delete(t, url, got...)
	}
	return out
}

func sqsAttrs(m types.Message) map[string]string {
	out := map[string]string{}
	for k, v := range m.MessageAttributes {
		out[k] = aws.ToString(v.StringValue)
	}
	return out
}

// ops maps each event's payload to its operation id, as EnqueueTx computes it (index i of
// one call).
func ops(events []outbox.Event) map[string]string {
	out := map[string]string{}
	for i, e := range events {
		out[string(e.Payload)] = outbox.OperationID(e.Pipeline, e.CausationID, i).String()
	}
	return out
}

func pubsubRecords(msgs []*pubsubpb.PubsubMessage) []recordLike {
	out := make([]recordLike, len(msgs))
	for i, m := range msgs {
		out[i] = recordLike{string(m.Data)}
	}
	return out
}

func sqsRecords(msgs []types.Message) []recordLike {
	out := make([]recordLike, len(msgs))
	for i, m := range msgs {
		out[i] = recordLike{aws.ToString(m.Body)}
	}
	return out
}

// recordLike is a published payload, for requireOrder.
type recordLike struct{ payload string }

// requireOrder checks that payloads "<prefix>:<key>:<seq>" come in sequence per key, each
// once at least, want distinct in all.
func requireOrder(t *testing.T, records []recordLike, want int) {
	t.Helper()
	seen := map[string]bool{}
	last := map[string]int{}
	for _, r := range records {
		if seen[r.payload] {
			continue // an at-least-once repeat
		}
		seen[r.payload] = true
		parts := strings.Split(r.payload, ":")
		require.Len(t, parts, 3, r.payload)
		var seq int
		_, err := fmt.Sscanf(parts[2], "%d", &seq)
		require.NoError(t, err)
		if prev, ok := last[parts[1]]; ok {
			require.Equal(t, prev+1, seq, "key %s out of order at %s", parts[1], r.payload)
		} else {
			require.Zero(t, seq, "key %s starts at %s", parts[1], r.payload)
		}
		last[parts[1]] = seq
	}
	require.Len(t, seen, want)
}

// TestRelayPublishesToPubSubAndSQS: a relay without Kafka publishes outbox rows to a Pub/Sub
// topic (by id and by full name) and an SQS FIFO queue (by name): each message carries
// operation-id, causation-id, idemd-pipeline, the row's headers and its traceparent as
// attributes; the key is the Pub/Sub ordering key and the SQS MessageGroupId, the operation
// id the MessageDeduplicationId; each key's order is kept.
func TestRelayPublishesToPubSubAndSQS(t *testing.T) {
	t.Parallel()
	b := setupBrokerRelay(t, pubsubtest.Client(t), sqstest.Client(t))
	topic, sub := orderedTopic(t)
	fifo := sqstest.FIFOQueue(t, nil)
	queue := fifo[strings.LastIndexByte(fifo, '/')+1:]

	toPubSub := brokerEvents(outbox.PubSubDestination(pubsubtest.ID(topic)), "ps", 40, "k1", "k2", "k3")
	toPubSub = append(toPubSub, brokerEvents(outbox.PubSubDestination(topic), "full", 5, "k9")...)
	toSQS := brokerEvents(outbox.SQSDestination(queue), "sq", 25, "order-7")
	all := interleave(toPubSub, toSQS)
	b.enqueue(t, all...)
	opOf := ops(all)

	r, _ := b.startRelay(t, b.config())
	b.drain(t, r, 30*time.Second)

	got := pullAll(t, sub, len(toPubSub), len(toPubSub))
	requireOrder(t, pubsubRecords(got), len(toPubSub))
	for _, m := range got {
		key := strings.Split(string(m.Data), ":")[1]
		require.Equal(t, key, m.OrderingKey, "the key is the ordering key")
		require.Equal(t, map[string]string{
			outbox.HeaderOperationID: opOf[string(m.Data)], outbox.HeaderCausationID: m.Attributes[outbox.HeaderCausationID],
			outbox.HeaderPipeline: "p", outbox.HeaderEventType: "order.paid", "traceparent": tracedParent,
		}, m.Attributes)
		require.True(t, strings.HasPrefix(m.Attributes[outbox.HeaderCausationID], strings.Split(string(m.Data), ":")[0]+"-"))
	}

	msgs := receiveFIFO(t, fifo, len(toSQS))
	requireOrder(t, sqsRecords(msgs), len(toSQS))
	for _, m := range msgs {
		a := sqsAttrs(m)
		require.Equal(t, opOf[aws.ToString(m.Body)], a[outbox.HeaderOperationID])
		require.Equal(t, "p", a[outbox.HeaderPipeline])
		require.NotEmpty(t, a[outbox.HeaderCausationID])
		require.Equal(t, tracedParent, a["traceparent"])
		require.Equal(t, "order.paid", a[outbox.HeaderEventType])
	}
	sent := b.sqs.entries()
	require.Len(t, sent, len(toSQS))
	for _, e := range sent {
		require.Equal(t, "order-7", e.group, "the key is the MessageGroupId")
		require.Equal(t, opOf[e.body], e.dedup, "the operation id is the MessageDeduplicationId")
	}
	require.Zero(t, b.db.Count(t, "{schema}.outbox"), "published rows are deleted")
	require.Zero(t, b.db.Count(t, "{schema}.dead_letters"))
}

// TestRelayBrokersCrashBetweenPublishAndMark: the relay stops (AfterPublish fails, as a
// crash would) after Pub/Sub and SQS acknowledged a round and before it marked it. The
// next relay publishes those rows again with the same operation id: Pub/Sub subscribers
// see them twice with one operation id (idemd's subscriptions dedupe on it), and the SQS
// FIFO queue drops the repeats itself, their MessageDeduplicationId being the same.
func TestRelayBrokersCrashBetweenPublishAndMark(t *testing.T) {
	t.Parallel()
	b := setupBrokerRelay(t, pubsubtest.Client(t), sqstest.Client(t))
	topic, sub := orderedTopic(t)
	fifo := sqstest.FIFOQueue(t, nil)
	toPubSub := brokerEvents(outbox.PubSubDestination(pubsubtest.ID(topic)), "ps", 30, "a", "b")
	toSQS := brokerEvents(outbox.SQSDestination(fifo), "sq", 30, "g")
	all := interleave(toPubSub, toSQS)
	b.enqueue(t, all...)
	opOf := ops(all)

	crashed := errors.New("simulated crash after publish")
	cfg := b.config()
	cfg.BatchSize = 20
	first := make(chan []int64, 1)
	cfg.AfterPublish = func(ids []int64) error { first <- ids; return crashed }
	_, stop := b.startRelay(t, cfg)
	var published []int64
	select {
	case published = <-first:
	case <-time.After(30 * time.Second):
		t.Fatal("the relay never published")
	}
	require.ErrorIs(t, stop(), crashed)
	require.Len(t, published, 20)
	require.Equal(t, len(all), b.db.Count(t, "{schema}.outbox"), "nothing was marked")

	second, _ := b.startRelay(t, b.config())
	b.drain(t, second, 30*time.Second)

	got := pullAll(t, sub, len(toPubSub), len(toPubSub)+10)
	require.Len(t, got, len(toPubSub)+10, "the crashed round's 10 Pub/Sub rows twice, then the rest")
	for _, m := range got {
		require.Equal(t, opOf[string(m.Data)], m.Attributes[outbox.HeaderOperationID], "a re-published message carries the same operation-id")
	}
	requireOrder(t, pubsubRecords(got), len(toPubSub))

	msgs := receiveFIFO(t, fifo, len(toSQS))
	requireOrder(t, sqsRecords(msgs), len(toSQS))
	require.Empty(t, sqstest.Receive(t, fifo, 10, time.Second, 0), "SQS dropped the re-published messages")
	sent := b.sqs.entries()
	require.Len(t, sent, len(toSQS)+10, "the crashed round's 10 SQS rows were sent twice")
	for _, e := range sent {
		require.Equal(t, opOf[e.body], e.dedup)
	}
}

// TestRelayPubSubAndSQSOutage: Pub/Sub and SQS unreachable (a proxy in front of them refuses
// every connection). The rows wait, none lost nor dead-lettered, both destinations held as
// failing; once the brokers are back, the backlog is published, every row once at least and
// in key order.
func TestRelayPubSubAndSQSOutage(t *testing.T) {
	t.Parallel()
	psProxy := outageproxy.New(t, pubsubtest.Addr(t))
	sqsProxy := outageproxy.New(t, strings.TrimPrefix(sqstest.Endpoint(t), "http://"))
	psClient, err := pubsub.NewClient(context.Background(), pubsubtest.Project, option.WithEndpoint(psProxy.Addr()),
		option.WithoutAuthentication(), option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	require.NoError(t, err)
	t.Cleanup(func() { _ = psClient.Close() })
	sqsClient := sqs.New(sqs.Options{Region: sqsfake.Region, BaseEndpoint: aws.String("http://" + sqsProxy.Addr()),
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", "")})
	b := setupBrokerRelay(t, psClient, sqsClient)
	topic, sub := orderedTopic(t)
	fifo := sqstest.FIFOQueue(t, nil)
	psDest, sqsDest := outbox.PubSubDestination(topic), outbox.SQSDestination(fifo)

	psProxy.SetDown(true)
	sqsProxy.SetDown(true)
	toPubSub := brokerEvents(psDest, "ps", 30, "a", "b", "c")
	toSQS := brokerEvents(sqsDest, "sq", 20, "g")
	b.enqueue(t, interleave(toPubSub, toSQS)...)
	cfg := b.config()
	cfg.MaxFailingFor = 50 * time.Millisecond // an outage never counts towards it
	r, _ := b.startRelay(t, cfg, func(s *outbox.RelaySignals) { s.Round.Init(t) })
	failed := map[string]bool{}
	r.TestSignals().Round.WaitFor(t, "both destinations failed", func(rd outbox.RelayRound) bool {
		for _, d := range rd.Failed {
			failed[d] = true
		}
		return failed[psDest] && failed[sqsDest]
	})
	// More failed rounds, well past MaxFailingFor: nothing is dead-lettered.
	for range 3 {
		r.TestSignals().Round.WaitFor(t, "another failed round", func(rd outbox.RelayRound) bool { return len(rd.Failed) > 0 })
	}
	require.Equal(t, len(toPubSub)+len(toSQS), b.db.Count(t, "{schema}.outbox"), "the rows wait")
	require.Zero(t, b.db.Count(t, "{schema}.dead_letters"), "an outage dead-letters nothing")

	psProxy.SetDown(false)
	sqsProxy.SetDown(false)
	b.drain(t, r, 60*time.Second)
	requireOrder(t, pubsubRecords(pullAll(t, sub, len(toPubSub), len(toPubSub))), len(toPubSub))
	requireOrder(t, sqsRecords(receiveFIFO(t, fifo, len(toSQS))), len(toSQS))
	require.Zero(t, b.db.Count(t, "{schema}.dead_letters"))
}

// TestRelayHoldsAMissingQueueUntilItExists: rows bound for an SQS queue and a Pub/Sub topic
// that do not exist wait, their destinations held as failing (MaxFailingFor has not
// passed), while the rows of an existing queue are published; once the queue and topic are
// created, their rows are published in order.
func TestRelayHoldsAMissingQueueUntilItExists(t *testing.T) {
	t.Parallel()
	b := setupBrokerRelay(t, pubsubtest.Client(t), sqstest.Client(t))
	good := sqstest.Queue(t, nil)
	missingQueue := sqstest.Name(t) + "-later.fifo"
	missingTopic := pubsubtest.Name(t) + "-later"
	okEvents := brokerEvents(outbox.SQSDestination(good), "ok", 20, "x")
	heldSQS := brokerEvents(outbox.SQSDestination(missingQueue), "hq", 12, "g")
	heldPS := brokerEvents(outbox.PubSubDestination(missingTopic), "ht", 12, "a", "b")
	b.enqueue(t, interleave(interleave(heldSQS, heldPS), okEvents)...)
	cfg := b.config()
	cfg.MaxFailingFor = time.Hour
	r, stop := b.startRelay(t, cfg, func(s *outbox.RelaySignals) { s.Round.Init(t) })

	failed := map[string]bool{}
	r.TestSignals().Round.WaitFor(t, "both missing destinations failed", func(rd outbox.RelayRound) bool {
		for _, d := range rd.Failed {
			failed[d] = true
		}
		return failed[outbox.SQSDestination(missingQueue)] && failed[outbox.PubSubDestination(missingTopic)]
	})
	require.Len(t, sqstest.ReceiveN(t, good, len(okEvents), 20*time.Second), len(okEvents), "the existing queue's rows go on")
	require.Equal(t, len(heldSQS)+len(heldPS), b.db.Count(t, "{schema}.outbox"), "the missing destinations' rows wait")
	require.Zero(t, b.db.Count(t, "{schema}.dead_letters"))

	url := sqstest.CreateQueue(t, missingQueue, map[string]string{"FifoQueue": "true"})
	// A Pub/Sub topic drops what is published to it before it has a subscription, and the
	// running relay would publish in the moment between the two: the topic and its
	// subscription are created while no relay runs, and a new relay publishes the rows the
	// first one held.
	require.NoError(t, stop())
	c := pubsubtest.Client(t)
	_, err := c.TopicAdminClient.CreateTopic(context.Background(), &pubsubpb.Topic{Name: pubsubtest.TopicName(missingTopic)})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = c.TopicAdminClient.DeleteTopic(context.Background(), &pubsubpb.DeleteTopicRequest{Topic: pubsubtest.TopicName(missingTopic)})
	})
	sub := pubsubtest.Subscription(t, pubsubtest.TopicName(missingTopic), pubsubtest.SubscriptionConfig{Ordered: true})
	require.Zero(t, b.db.Count(t, "{schema}.dead_letters"), "held, never dead-lettered")
	r, _ = b.startRelay(t, cfg)
	b.drain(t, r, 30*time.Second)
	requireOrder(t, sqsRecords(receiveFIFO(t, url, len(heldSQS))), len(heldSQS))
	requireOrder(t, pubsubRecords(pullAll(t, sub, len(heldPS), len(heldPS))), len(heldPS))
}

// TestRelayDeadLettersAMissingQueueAfterMaxFailingFor: a queue that stays missing for
// MaxFailingFor has its rows dead-lettered, with their destination and operation id; a
// replay, once the queue exists, publishes each again to that queue with that operation id.
func TestRelayDeadLettersAMissingQueueAfterMaxFailingFor(t *testing.T) {
	t.Parallel()
	b := setupBrokerRelay(t, pubsubtest.Client(t), sqstest.Client(t))
	missing := sqstest.Name(t) + "-gone"
	events := brokerEvents(outbox.SQSDestination(missing), "gone", 4, "g")
	// A pipeline of its own: its replay counter is this test's.
	for i := range events {
		events[i].Pipeline = "missing-queue-replays"
	}
	b.enqueue(t, events...)
	opOf := ops(events)
	cfg := b.config()
	cfg.MaxFailingFor = 200 * time.Millisecond
	r, _ := b.startRelay(t, cfg)
	b.drain(t, r, 30*time.Second)

	letters, err := deadletter.New(b.db.Schema).List(context.Background(), b.db.Pool, deadletter.Filter{Limit: 100})
	require.NoError(t, err)
	require.Len(t, letters, len(events))
	for _, l := range letters {
		require.Equal(t, "sqs:"+missing, l.Scope)
		require.Equal(t, outbox.SQSDestination(missing), l.Metadata["topic"])
		require.Equal(t, opOf[string(l.Payload)], l.Origin.OperationID.String())
		require.Contains(t, l.Reason, "SQS queue "+missing+" has refused every publish")
		require.Contains(t, l.Reason, "MaxFailingFor")
	}

	url := sqstest.CreateQueue(t, missing, nil)
	rp := deadletter.NewReplayer(b.db.Pool, deadletter.New(b.db.Schema))
	b.store.RegisterReplay(rp)
	requeued := map[string]string{"pipeline": "missing-queue-replays", "door": "relay", "outcome": "requeued"}
	before, _ := metricstest.Sum(t, "idemd_dead_letters_replayed_total", requeued)
	for _, l := range letters {
		out, err := rp.Replay(context.Background(), l.ID)
		require.NoError(t, err)
		require.Contains(t, out.Done, fmt.Sprintf("event requeued to SQS queue %q with the same operation id", missing))
		require.Equal(t, deadletter.ReplayRequeued, out.Outcome)
	}
	after, _ := metricstest.Sum(t, "idemd_dead_letters_replayed_total", requeued)
	require.Equal(t, float64(len(letters)), after-before, "each requeue counted once, after its commit")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, r.Drain(ctx))
	msgs := sqstest.ReceiveN(t, url, len(events), 20*time.Second)
	for _, m := range msgs {
		require.Equal(t, opOf[aws.ToString(m.Body)], sqsAttrs(m)[outbox.HeaderOperationID], "the replay keeps the operation id")
	}
	requireOrder(t, sqsRecords(msgs), len(events))
}

// TestRelayDeadLettersAnEventItsBrokerRefuses: an event above the SQS queue's size limit,
// and one above Pub/Sub's 10 MB, are dead-lettered alone with a reason that says so; the
// later events of their key, held behind them by the publisher, and every other event go
// on in order. A replay puts the refused event back with its destination and operation id.
func TestRelayDeadLettersAnEventItsBrokerRefuses(t *testing.T) {
	t.Parallel()
	b := setupBrokerRelay(t, pubsubtest.Client(t), sqstest.Client(t))
	queue := sqstest.FIFOQueue(t, map[string]string{"MaximumMessageSize": "1024"})
	topic, sub := orderedTopic(t)

	toSQS := brokerEvents(outbox.SQSDestination(queue), "sq", 6, "g")
	bigSQS := outbox.Event{Topic: outbox.SQSDestination(queue), Key: []byte("g"), Payload: []byte(strings.Repeat("x", 2000)), Pipeline: "p", CausationID: "big-sqs"}
	toSQS = append(toSQS[:3:3], append([]outbox.Event{bigSQS}, toSQS[3:]...)...)
	toPubSub := brokerEvents(outbox.PubSubDestination(topic), "ps", 6, "k")
	bigPS := outbox.Event{Topic: outbox.PubSubDestination(topic), Key: []byte("k"), Payload: make([]byte, 11<<20), Pipeline: "p", CausationID: "big-ps"}
	toPubSub = append(toPubSub[:2:2], append([]outbox.Event{bigPS}, toPubSub[2:]...)...)
	all := append(toSQS, toPubSub...)
	b.enqueue(t, all...)
	opOf := ops(all)

	r, stop := b.startRelay(t, b.config())
	b.drain(t, r, 60*time.Second)

	letters, err := deadletter.New(b.db.Schema).List(context.Background(), b.db.Pool, deadletter.Filter{Limit: 100})
	require.NoError(t, err)
	require.Len(t, letters, 2)
	byMessage := map[string]*deadletter.Letter{}
	for _, l := range letters {
		byMessage[l.MessageID] = l
	}
	l := byMessage["big-sqs"]
	require.NotNil(t, l)
	require.Equal(t, "sqs:"+queue, l.Scope)
	require.Contains(t, l.Reason, "SQS refuses the event for good")
	require.Contains(t, l.Reason, "at most 1024")
	require.Equal(t, opOf[string(bigSQS.Payload)], l.Origin.OperationID.String())
	l = byMessage["big-ps"]
	require.NotNil(t, l)
	require.Equal(t, "pubsub:"+topic, l.Scope)
	require.Contains(t, l.Reason, "Pub/Sub refuses the event for good")

	requireOrder(t, sqsRecords(receiveFIFO(t, queue, 6)), 6)
	requireOrder(t, pubsubRecords(pullAll(t, sub, 6, 6)), 6)

	// A replay (once the queue takes larger messages) puts it back with its destination
	// and operation id.
	require.NoError(t, stop())
	rp := deadletter.NewReplayer(b.db.Pool, deadletter.New(b.db.Schema))
	b.store.RegisterReplay(rp)
	_, err = rp.Replay(context.Background(), byMessage["big-sqs"].ID)
	require.NoError(t, err)
	require.Equal(t, outbox.SQSDestination(queue), b.db.Text(t, "SELECT topic FROM {schema}.outbox"))
	require.Equal(t, opOf[string(bigSQS.Payload)], b.db.Text(t, "SELECT operation_id::text FROM {schema}.outbox"))
}

// TestRelayMixedDestinations: one round holds rows for a Kafka topic, a Pub/Sub topic, an
// SQS queue, and an SQS queue that does not exist, interleaved. The missing queue fails
// alone: the others are published in full and in key order while its rows wait.
func TestRelayMixedDestinations(t *testing.T) {
	t.Parallel()
	kb := setupRelay(t, 3, pgtest.Options{})
	b := &brokerRelay{relayBundle: kb}
	ps, err := outbox.NewPubSubPublisher(pubsubtest.Client(t), nil)
	require.NoError(t, err)
	b.pubsub, b.sqs = ps, &recordingSQS{Client: sqstest.Client(t)}
	topic, sub := orderedTopic(t)
	queue := sqstest.Queue(t, nil)
	missing := sqstest.Name(t) + "-missing"

	toKafka := keyed(b.topic, "kf", 60, 3)
	toPubSub := brokerEvents(outbox.PubSubDestination(topic), "ps", 60, "a", "b", "c")
	toSQS := brokerEvents(outbox.SQSDestination(queue), "sq", 30, "x")
	held := brokerEvents(outbox.SQSDestination(missing), "held", 30, "y")
	b.enqueue(t, interleave(interleave(held, toKafka), interleave(toPubSub, toSQS))...)

	cfg := b.config()
	cfg.Brokers = kafkatest.Brokers(t)
	cfg.BatchSize = 1000
	cfg.MaxFailingFor = time.Hour
	r, _ := b.startRelay(t, cfg, func(s *outbox.RelaySignals) { s.Round.Init(t) })
	rd := r.TestSignals().Round.WaitFor(t, "the first round", func(outbox.RelayRound) bool { return true })
	require.Equal(t, []string{outbox.SQSDestination(missing)}, rd.Failed)
	require.Equal(t, len(toKafka)+len(toPubSub)+len(toSQS), rd.Published, "one round published every other destination")

	requireKeyOrder(t, kafkatest.ReadAll(t, b.topic, len(toKafka), 30*time.Second), len(toKafka))
	requireOrder(t, pubsubRecords(pullAll(t, sub, len(toPubSub), len(toPubSub))), len(toPubSub))
	requireOrder(t, sqsRecords(sqstest.ReceiveN(t, queue, len(toSQS), 20*time.Second)), len(toSQS))
	require.Equal(t, len(held), b.db.Count(t, "{schema}.outbox"), "only the missing queue's rows wait")
}

// TestRelayWithoutAClient: a relay with Kafka only holds the rows bound for Pub/Sub as
// failing, with an error that names the missing client, and never dead-letters them (an
// operator's configuration, not the broker, is missing); its Kafka rows go on.
func TestRelayWithoutAClient(t *testing.T) {
	t.Parallel()
	b := setupRelay(t, 1, pgtest.Options{})
	toKafka := keyed(b.topic, "kf", 10, 2)
	orphan := brokerEvents(outbox.PubSubDestination("orders"), "orphan", 3, "a")
	b.enqueue(t, interleave(orphan, toKafka)...)
	logger := quietLogger()
	logger.Logger.SetLevel(logrus.WarnLevel)
	failed := &signalHook{match: "error publishing to a topic or queue", ch: make(chan *logrus.Entry, 1)}
	logger.Logger.AddHook(failed)
	r, _ := b.startRelay(t, outbox.RelayConfig{Logger: logger, MaxFailingFor: time.Millisecond,
		BackoffMin: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond}, func(s *outbox.RelaySignals) { s.Round.Init(t) })
	requireKeyOrder(t, kafkatest.ReadAll(t, b.topic, len(toKafka), 30*time.Second), len(toKafka))
	var e *logrus.Entry
	select {
	case e = <-failed.ch:
	case <-time.After(30 * time.Second):
		t.Fatal("no failure logged")
	}
	require.Equal(t, "pubsub:orders", e.Data["topic"])
	require.ErrorContains(t, e.Data["error"].(error), "no Pub/Sub client")
	for range 3 {
		r.TestSignals().Round.WaitFor(t, "another failed round", func(rd outbox.RelayRound) bool { return len(rd.Failed) > 0 })
	}
	require.Equal(t, len(orphan), b.db.Count(t, "{schema}.outbox"))
	require.Zero(t, b.db.Count(t, "{schema}.dead_letters"), "a missing client never dead-letters")
}

// TestNewRelayNeedsAPublisher: a relay needs Kafka brokers, a Writer, or a broker's
// Publisher.
func TestNewRelayNeedsAPublisher(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	_, err := outbox.NewRelay(db.Pool, &outbox.RelayConfig{Schema: db.Schema})
	require.ErrorContains(t, err, "RelayConfig.Brokers is required")
	p, err := outbox.NewSQSPublisher(sqstest.Client(t))
	require.NoError(t, err)
	_, err = outbox.NewRelay(db.Pool, &outbox.RelayConfig{Schema: db.Schema, SQS: p})
	require.NoError(t, err)
}

// TestRelayTracesPubSubAndSQSSends: the relay's send span of a Pub/Sub or SQS destination
// names the broker (messaging.system gcp_pubsub, aws_sqs) and the topic or queue as the
// broker knows it; the published counter is labelled with the encoded destination.
func TestRelayTracesPubSubAndSQSSends(t *testing.T) {
	t.Parallel()
	b := setupBrokerRelay(t, pubsubtest.Client(t), sqstest.Client(t))
	topic := pubsubtest.ID(pubsubtest.Topic(t))
	queue := sqstest.Queue(t, nil)
	psDest, sqsDest := outbox.PubSubDestination(topic), outbox.SQSDestination(queue)
	before := testutil.ToFloat64(metrics.OutboxPublished.WithLabelValues(psDest))
	b.enqueue(t, append(brokerEvents(psDest, "ps", 3, "a"), brokerEvents(sqsDest, "sq", 1, "b")...)...)
	provider, exporter := tracing.InMemory()
	cfg := b.config()
	cfg.TracerProvider = provider
	r, _ := b.startRelay(t, cfg)
	b.drain(t, r, 30*time.Second)

	for name, system := range map[string]string{topic: "gcp_pubsub", queue: "aws_sqs"} {
		sends := tracing.Named(exporter.GetSpans(), "send "+name)
		require.Len(t, sends, 1, name)
		require.Equal(t, trace.SpanKindProducer, sends[0].SpanKind)
		for key, want := range map[string]string{"messaging.system": system, "messaging.destination.name": name, "messaging.operation.type": "send"} {
			got, _ := tracing.Attr(sends[0], attribute.Key(key))
			require.Equal(t, want, got, key)
		}
	}
	sqsSend := tracing.Named(exporter.GetSpans(), "send "+queue)[0]
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", sqsSend.SpanContext.TraceID().String(), "the send of one traced row is its child")
	require.Equal(t, float64(3), testutil.ToFloat64(metrics.OutboxPublished.WithLabelValues(psDest))-before)
}

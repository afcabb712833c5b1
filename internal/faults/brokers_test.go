package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pubsubtest"
	"github.com/idemd/idemd/internal/sqstest"
	"github.com/idemd/idemd/outbox"
)

// brokerDoor is what a crash loop needs of one broker: the pipeline's source and publish
// target, the clients' environment, a way to send the input and to read the output.
type brokerDoor struct {
	source, target string
	env            map[string]string
	// send delivers messages (the id is the message-id attribute; the same id sent twice
	// is two broker messages, as a producer's retry makes).
	send func(t *testing.T, ids []string)
	// read returns the operation id → causation id of every message on the output, read
	// until it holds want distinct operation ids, and the number of messages read.
	read func(t *testing.T, want int) (map[string]string, int)
}

// TestBrokerCrashLoop (issue 13): for Pub/Sub and for SQS, messages with 20% redeliveries
// (the same message-id attribute sent again: a new broker message) are consumed by one
// idemd, killed with SIGKILL mid-batch at random moments (at least 5 times) and restarted
// each time; the messages it held unacknowledged come back after their lease. Effects equal
// the unique ids exactly, every outbox row is published, and the output (a topic or queue
// of the same broker) carries one distinct operation id per unique id.
func TestBrokerCrashLoop(t *testing.T) {
	t.Parallel()
	t.Run("pubsub", func(t *testing.T) {
		t.Parallel()
		in := pubsubtest.Topic(t)
		sub := pubsubtest.Subscription(t, in, pubsubtest.SubscriptionConfig{AckDeadline: 10 * time.Second})
		out := pubsubtest.Topic(t)
		outSub := pubsubtest.Subscription(t, out, pubsubtest.SubscriptionConfig{AckDeadline: 60 * time.Second})
		brokerCrashLoop(t, "pubsub", brokerDoor{
			source: fmt.Sprintf("pubsub: {subscription: %s}", sub),
			target: fmt.Sprintf("{pubsub: {topic: %s}, key: {json: /id}}", out),
			env:    map[string]string{"PUBSUB_EMULATOR_HOST": pubsubtest.Addr(t), "PUBSUB_PROJECT_ID": pubsubtest.Project},
			send: func(t *testing.T, ids []string) {
				msgs := make([]pubsubtest.Message, len(ids))
				for i, id := range ids {
					msgs[i] = pubsubtest.Message{Data: body(id), Attributes: map[string]string{"message-id": id}}
				}
				pubsubtest.Publish(t, in, msgs...)
			},
			read: func(t *testing.T, want int) (map[string]string, int) {
				ops, n := map[string]string{}, 0
				acker := pubsubtest.Client(t)
				pubsubtest.PullUntil(t, outSub, 2*time.Minute, func(got []*pubsubpb.ReceivedMessage) bool {
					var acks []string
					for _, m := range got[n:] {
						ops[m.Message.Attributes[outbox.HeaderOperationID]] = m.Message.Attributes[outbox.HeaderCausationID]
						acks = append(acks, m.AckId)
					}
					n = len(got)
					if len(acks) > 0 {
						_ = acker.SubscriptionAdminClient.Acknowledge(context.Background(), &pubsubpb.AcknowledgeRequest{Subscription: outSub, AckIds: acks})
					}
					return len(ops) >= want
				})
				return ops, n
			},
		})
	})
	t.Run("sqs", func(t *testing.T) {
		t.Parallel()
		in := sqstest.Queue(t, nil)
		out := sqstest.FIFOQueue(t, nil)
		brokerCrashLoop(t, "sqs", brokerDoor{
			// A short lease, so that the messages a killed process held come back soon.
			source: fmt.Sprintf("sqs: {queue: %s}\n    lease: 3s", in),
			target: fmt.Sprintf("{sqs: {queue: %s}, key: {json: /id}}", out),
			env: map[string]string{"AWS_ENDPOINT_URL_SQS": sqstest.Endpoint(t), "AWS_REGION": "us-east-1",
				"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"},
			send: func(t *testing.T, ids []string) {
				msgs := make([]sqstest.Message, len(ids))
				for i, id := range ids {
					msgs[i] = sqstest.Message{Body: string(body(id)), Attributes: map[string]string{"message-id": id}}
				}
				sqstest.Send(t, in, msgs...)
			},
			read: func(t *testing.T, want int) (map[string]string, int) {
				ops, n := map[string]string{}, 0
				deadline := time.Now().Add(2 * time.Minute)
				for len(ops) < want {
					require.True(t, time.Now().Before(deadline), "%d of %d operation ids on the output queue", len(ops), want)
					msgs := sqstest.Receive(t, out, 10, time.Second, 0)
					var done []types.DeleteMessageBatchRequestEntry
					for i, m := range msgs {
						n++
						ops[aws.ToString(m.MessageAttributes[outbox.HeaderOperationID].StringValue)] = aws.ToString(m.MessageAttributes[outbox.HeaderCausationID].StringValue)
						done = append(done, types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle})
					}
					if len(done) > 0 {
						_, err := sqstest.Client(t).DeleteMessageBatch(context.Background(), &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(out), Entries: done})
						require.NoError(t, err)
					}
				}
				return ops, n
			},
		})
	})
}

func body(id string) string { return fmt.Sprintf(`{"id":%q,"amount":%d}`, id, len(id)) }

func brokerCrashLoop(t *testing.T, door string, b brokerDoor) {
	n, kills := size(2000, 20000), size(5, 10)
	if door == "pubsub" {
		// pstest hands out about one message per 10 ms per streaming pull.
		n = size(2000, 10000)
	}
	wait := time.Duration(size(5, 15)) * time.Minute
	d := newDB(t, effectsDDL)
	file := writeFile(t, fmt.Sprintf(`subscriptions:
  - name: crash
    %s
    message_id: {attribute: message-id}
    effect: {sql: "INSERT INTO %s.effects (message_id, applied_by) VALUES (@message_id, current_setting('application_name'))"}
    publish: %s
`, b.source, d.schema, b.target))
	// 20% redeliveries: the same ids sent again, shuffled among the first sends.
	unique := n * 4 / 5
	ids := make([]string, unique)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%06d", door, i)
	}
	sends := append([]string(nil), ids...)
	for len(sends) < n {
		sends = append(sends, ids[rand.IntN(unique)])
	}
	rand.Shuffle(len(sends), func(i, j int) { sends[i], sends[j] = sends[j], sends[i] })

	nd := newNode(t, d.schema, file, "consumer,relay", nil, b.env)
	// Published rows are kept, so that the outbox rows can be counted: one per unique id.
	nd.vars["IDEMD_OUTBOX_KEEP_PUBLISHED"] = "true"
	p := nd.startReady()
	w := d.watch(t, "effects", "outbox")
	start := time.Now()
	wave := (len(sends) + kills) / (kills + 1)
	for i := range kills + 1 {
		before := d.count(t, "effects")
		b.send(t, sends[i*wave:min((i+1)*wave, len(sends))])
		if i == kills {
			break
		}
		until(t, w, nil, wait, fmt.Sprintf("progress before kill %d", i+1), func() bool { return d.count(t, "effects") > before })
		time.Sleep(time.Duration(rand.IntN(100)) * time.Millisecond)
		p.Kill(t)
		t.Logf("kill %d at %d of %d effects", i+1, d.count(t, "effects"), len(ids))
		p = nd.startReady()
	}
	until(t, w, nil, wait, "every effect and every outbox row published", func() bool {
		return d.count(t, "effects") >= len(ids) && d.count(t, "outbox WHERE published_at IS NULL") == 0
	})
	rows, _ := checkEffects(t, d, len(ids))
	require.Equal(t, len(ids), d.outboxRows(t), "one outbox row per unique id")
	require.Equal(t, len(ids), d.count(t, "processed_messages"))
	ops, records := b.read(t, len(ids))
	for _, id := range ids {
		op := outbox.OperationID("crash", id, 0).String()
		require.Equal(t, id, ops[op], "the message of %s is on the output with its stable operation id", id)
	}
	require.Len(t, ops, len(ids), "distinct operation ids = unique ids")
	require.Equal(t, 0, p.Stop(t, stopTimeout))
	t.Logf("FIGURES %s-crash-loop: messages=%d unique=%d redeliveries=%d kills=%d effects=%d lost=0 duplicated=0 outbox=%d unpublished=0 records=%d distinct_operation_ids=%d republished=%d took=%s",
		door, n, len(ids), n-len(ids), kills, rows, d.outboxRows(t), records, len(ops), records-len(ops), time.Since(start).Round(time.Second))
}

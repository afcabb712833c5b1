package sqstest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"github.com/stretchr/testify/require"
)

func bodies(msgs []types.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = aws.ToString(m.Body)
	}
	return out
}

func deleteAll(t *testing.T, url string, msgs ...types.Message) {
	t.Helper()
	entries := make([]types.DeleteMessageBatchRequestEntry, len(msgs))
	for i, m := range msgs {
		entries[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(fmt.Sprint(i)), ReceiptHandle: m.ReceiptHandle}
	}
	out, err := Client(t).DeleteMessageBatch(context.Background(), &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(url), Entries: entries})
	require.NoError(t, err)
	require.Empty(t, out.Failed)
	require.Len(t, out.Successful, len(msgs))
}

// TestBatchSendReceiveDelete: SendMessageBatch with message attributes, ReceiveMessage and
// DeleteMessageBatch through the official client. Of two messages received with a 1 s
// visibility, the deleted one does not come back when the other one does.
func TestBatchSendReceiveDelete(t *testing.T) {
	t.Parallel()
	url := Queue(t, nil)
	ids := Send(t, url,
		Message{Body: `{"n":1}`, Attributes: map[string]string{"operation-id": "op-1", "idemd-pipeline": "p"}},
		Message{Body: `{"n":2}`, Attributes: map[string]string{"operation-id": "op-2"}})
	require.NotEmpty(t, ids[0])
	require.NotEqual(t, ids[0], ids[1])

	got := map[string]types.Message{}
	for len(got) < 2 {
		for _, m := range Receive(t, url, 10, time.Second, time.Second) {
			got[aws.ToString(m.MessageId)] = m
		}
	}
	first := got[ids[0]]
	require.Equal(t, `{"n":1}`, aws.ToString(first.Body))
	require.Equal(t, "op-1", aws.ToString(first.MessageAttributes["operation-id"].StringValue))
	require.Equal(t, "String", aws.ToString(first.MessageAttributes["operation-id"].DataType))
	require.Equal(t, "p", aws.ToString(first.MessageAttributes["idemd-pipeline"].StringValue))

	deleteAll(t, url, first)
	again := ReceiveN(t, url, 1, 10*time.Second)
	require.Equal(t, []string{`{"n":2}`}, bodies(again), "only the undeleted message is redelivered")
	require.Equal(t, ids[1], aws.ToString(again[0].MessageId), "a redelivery keeps the message id")
	require.NotEqual(t, aws.ToString(got[ids[1]].ReceiptHandle), aws.ToString(again[0].ReceiptHandle), "a redelivery gets a new receipt handle")
	deleteAll(t, url, again...)
}

// TestVisibilityExtension: of two messages received with a 1 s visibility, the one whose
// visibility was extended (ChangeMessageVisibility) is not redelivered when the other is;
// visibility 0 makes a message visible again at once.
func TestVisibilityExtension(t *testing.T) {
	t.Parallel()
	url := Queue(t, nil)
	Send(t, url, Message{Body: "extended"}, Message{Body: "expires"})
	got := ReceiveN(t, url, 2, 10*time.Second)
	c := Client(t)
	var extended types.Message
	for _, m := range got {
		if aws.ToString(m.Body) == "extended" {
			extended = m
		}
	}
	for _, m := range got {
		vis := int32(1)
		if aws.ToString(m.Body) == "extended" {
			vis = 60
		}
		_, err := c.ChangeMessageVisibility(context.Background(), &sqs.ChangeMessageVisibilityInput{
			QueueUrl: aws.String(url), ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: vis,
		})
		require.NoError(t, err)
	}
	again := ReceiveN(t, url, 1, 10*time.Second)
	require.Equal(t, []string{"expires"}, bodies(again))

	// Released at once: visibility 0.
	_, err := c.ChangeMessageVisibility(context.Background(), &sqs.ChangeMessageVisibilityInput{
		QueueUrl: aws.String(url), ReceiptHandle: extended.ReceiptHandle, VisibilityTimeout: 0,
	})
	require.NoError(t, err)
	released := ReceiveN(t, url, 1, 10*time.Second)
	require.Equal(t, []string{"extended"}, bodies(released))
	deleteAll(t, url, append(again, released...)...)
}

// TestFIFO: messages of one MessageGroupId come in send order, the next only after the
// previous one was deleted; a MessageDeduplicationId seen before drops the second send.
func TestFIFO(t *testing.T) {
	t.Parallel()
	url := FIFOQueue(t, nil)
	Send(t, url,
		Message{Body: "g-1", GroupID: "g", DeduplicationID: "op-1"},
		Message{Body: "g-2", GroupID: "g", DeduplicationID: "op-2"},
		Message{Body: "g-1 again", GroupID: "g", DeduplicationID: "op-1"},
		Message{Body: "g-3", GroupID: "g", DeduplicationID: "op-3"})

	var seen []string
	for len(seen) < 3 {
		got := ReceiveN(t, url, 1, 10*time.Second)
		if Kind(t) == "goaws" {
			// goaws hands out one message of a group at a time; SQS may hand out several,
			// in order.
			require.Len(t, got, 1)
		}
		seen = append(seen, bodies(got)...)
		// Nothing more of the group while it is in flight.
		require.Empty(t, Receive(t, url, 10, 0, 0))
		deleteAll(t, url, got...)
	}
	require.Equal(t, []string{"g-1", "g-2", "g-3"}, seen, "in order, and the duplicate was dropped")
}

// TestRedrivePolicy: a message received maxReceiveCount times without a delete moves to the
// dead-letter queue.
func TestRedrivePolicy(t *testing.T) {
	t.Parallel()
	dlq := Queue(t, nil)
	url := Queue(t, map[string]string{
		"RedrivePolicy": fmt.Sprintf(`{"deadLetterTargetArn":%q,"maxReceiveCount":"1"}`, QueueARN(t, dlq)),
	})
	Send(t, url, Message{Body: "poison"})
	require.Len(t, Receive(t, url, 1, 5*time.Second, time.Second), 1)
	dead := ReceiveN(t, dlq, 1, 15*time.Second)
	require.Equal(t, []string{"poison"}, bodies(dead))
}

// TestErrors: what the client reports for a missing queue and for a receipt handle that is
// not in flight. Error classification in the adapters relies on these codes.
func TestErrors(t *testing.T) {
	t.Parallel()
	c := Client(t)
	_, err := c.GetQueueUrl(context.Background(), &sqs.GetQueueUrlInput{QueueName: aws.String(Name(t))})
	var api smithy.APIError
	require.True(t, errors.As(err, &api), "%v", err)
	var missing *types.QueueDoesNotExist
	require.True(t, errors.As(err, &missing) || api.ErrorCode() == "AWS.SimpleQueueService.NonExistentQueue", "%v", err)

	url := Queue(t, nil)
	_, err = c.ChangeMessageVisibility(context.Background(), &sqs.ChangeMessageVisibilityInput{
		QueueUrl: aws.String(url), ReceiptHandle: aws.String("not-a-handle"), VisibilityTimeout: 5,
	})
	require.Error(t, err)
}

// TestGoawsLimitations proves what goaws v0.5.4 does differently from SQS (docs/brokers.md),
// so that a test relying on one of these fails here first, with a reason.
func TestGoawsLimitations(t *testing.T) {
	if Kind(t) != "goaws" {
		t.Skip("checks goaws itself")
	}
	t.Parallel()

	t.Run("no MessageGroupId, ApproximateReceiveCount stays 1", func(t *testing.T) {
		url := FIFOQueue(t, nil)
		Send(t, url, Message{Body: "a", GroupID: "g", DeduplicationID: "d"})
		got := Receive(t, url, 1, time.Second, time.Second)
		require.Len(t, got, 1)
		require.NotContains(t, got[0].Attributes, "MessageGroupId")
		again := ReceiveN(t, url, 1, 10*time.Second)
		require.Equal(t, "1", again[0].Attributes["ApproximateReceiveCount"])
	})

	t.Run("interleaved groups lose their order", func(t *testing.T) {
		// goaws locks one group at a time: locking b unlocks a, so a-3 overtakes a-2.
		url := FIFOQueue(t, nil)
		Send(t, url,
			Message{Body: "a-1", GroupID: "a", DeduplicationID: "1"},
			Message{Body: "a-2", GroupID: "a", DeduplicationID: "2"},
			Message{Body: "b-1", GroupID: "b", DeduplicationID: "3"},
			Message{Body: "a-3", GroupID: "a", DeduplicationID: "4"})
		require.Equal(t, []string{"a-1", "b-1", "a-3"}, bodies(Receive(t, url, 10, time.Second, 0)))
	})

	t.Run("ApproximateNumberOfMessages counts the messages in flight", func(t *testing.T) {
		// SQS counts the visible messages only; in flight are ApproximateNumberOfMessagesNotVisible.
		url := Queue(t, nil)
		Send(t, url, Message{Body: "a"}, Message{Body: "b"})
		require.Len(t, Receive(t, url, 1, time.Second, 30*time.Second), 1)
		out, err := Client(t).GetQueueAttributes(context.Background(), &sqs.GetQueueAttributesInput{
			QueueUrl: aws.String(url),
			AttributeNames: []types.QueueAttributeName{
				types.QueueAttributeNameApproximateNumberOfMessages, types.QueueAttributeNameApproximateNumberOfMessagesNotVisible,
			},
		})
		require.NoError(t, err)
		require.Equal(t, "2", out.Attributes["ApproximateNumberOfMessages"], "SQS would say 1")
		require.Equal(t, "1", out.Attributes["ApproximateNumberOfMessagesNotVisible"])
	})

	t.Run("deduplication ends when the message is deleted", func(t *testing.T) {
		url := FIFOQueue(t, nil)
		Send(t, url, Message{Body: "first", GroupID: "g", DeduplicationID: "op"})
		deleteAll(t, url, ReceiveN(t, url, 1, 10*time.Second)...)
		Send(t, url, Message{Body: "second", GroupID: "g", DeduplicationID: "op"})
		require.Equal(t, []string{"second"}, bodies(ReceiveN(t, url, 1, 10*time.Second)), "SQS would drop it for 5 minutes")
	})

	t.Run("visibility 0 on a FIFO message keeps its group locked", func(t *testing.T) {
		url := FIFOQueue(t, nil)
		Send(t, url, Message{Body: "a", GroupID: "g", DeduplicationID: "d"})
		got := ReceiveN(t, url, 1, 10*time.Second)
		_, err := Client(t).ChangeMessageVisibility(context.Background(), &sqs.ChangeMessageVisibilityInput{
			QueueUrl: aws.String(url), ReceiptHandle: got[0].ReceiptHandle, VisibilityTimeout: 0,
		})
		require.NoError(t, err)
		require.Empty(t, Receive(t, url, 1, 2*time.Second, 0), "SQS would redeliver it at once")
	})

	t.Run("GetQueueAttributes of a missing queue is InvalidParameterValue", func(t *testing.T) {
		_, err := Client(t).GetQueueAttributes(context.Background(), &sqs.GetQueueAttributesInput{QueueUrl: aws.String(Queue(t, nil) + "-missing")})
		var api smithy.APIError
		require.True(t, errors.As(err, &api), "%v", err)
		require.Equal(t, "AWS.SimpleQueueService.InvalidParameterValue", api.ErrorCode(), "SQS says QueueDoesNotExist")
	})

	t.Run("SendMessageBatch skips the size limit", func(t *testing.T) {
		url := Queue(t, map[string]string{"MaximumMessageSize": "1024"})
		big := string(make([]byte, 2048))
		_, err := Client(t).SendMessage(context.Background(), &sqs.SendMessageInput{QueueUrl: aws.String(url), MessageBody: aws.String(big)})
		require.Error(t, err, "SendMessage checks it")
		Send(t, url, Message{Body: big}) // SendMessageBatch does not
	})
}

// losingSQS is the test client, except that its ReceiveMessage loses the answers numbered in
// lose (counting the answers that hold messages, from 1) as goaws's are lost under load:
// goaws has marked their messages received, and the SDK fails reading the answer ("use of
// closed network connection"). The request after a lost answer is sent after
// pauseAfterLoss; the answers numbered in slow come back only after a delay.
type losingSQS struct {
	*sqs.Client
	lose           map[int]bool
	pauseAfterLoss time.Duration
	slow           map[int]time.Duration

	mu      sync.Mutex
	answers int
	pause   time.Duration
	lost    []string // bodies of the lost messages
}

func (l *losingSQS) ReceiveMessage(ctx context.Context, in *sqs.ReceiveMessageInput, opts ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error) {
	opts = append(opts, func(o *sqs.Options) { o.HTTPClient = losingHTTP{o.HTTPClient, l} })
	return l.Client.ReceiveMessage(ctx, in, opts...)
}

type losingHTTP struct {
	next sqs.HTTPClient
	l    *losingSQS
}

func (h losingHTTP) Do(req *http.Request) (*http.Response, error) {
	h.l.mu.Lock()
	pause := h.l.pause
	h.l.pause = 0
	h.l.mu.Unlock()
	time.Sleep(pause)
	resp, err := h.next.Do(req)
	if err != nil {
		return resp, err
	}
	raw, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(raw))
	var answer struct{ Messages []struct{ Body string } }
	if json.Unmarshal(raw, &answer) != nil || len(answer.Messages) == 0 {
		return resp, nil
	}
	h.l.mu.Lock()
	h.l.answers++
	n := h.l.answers
	lose := h.l.lose[n]
	if lose {
		for _, m := range answer.Messages {
			h.l.lost = append(h.l.lost, m.Body)
		}
		h.l.pause = h.l.pauseAfterLoss
	}
	h.l.mu.Unlock()
	if lose {
		resp.Body = io.NopCloser(io.MultiReader(bytes.NewReader(raw[:len(raw)/2]), iotest.ErrReader(
			fmt.Errorf("read tcp 127.0.0.1:1->127.0.0.1:2: use of closed network connection (answer %d lost by the test)", n))))
		return resp, nil
	}
	time.Sleep(h.l.slow[n])
	return resp, nil
}

func (l *losingSQS) lostBodies() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lost...)
}

func numbered(n int) (msgs []Message, want []string) {
	for i := range n {
		msgs = append(msgs, Message{Body: strconv.Itoa(i)})
		want = append(want, strconv.Itoa(i))
	}
	return msgs, want
}

// requireHeld checks that msgs are still in flight, once ReceiveN's short lease would have
// lapsed if wait, and deletes them with their receipt handles.
func requireHeld(t *testing.T, url string, msgs []types.Message, wait bool) {
	t.Helper()
	if wait {
		time.Sleep(receiveLease + lapseMargin)
	}
	require.Empty(t, Receive(t, url, 10, 0, 0), "what ReceiveN returned is still in flight")
	for start := 0; start < len(msgs); start += 10 {
		deleteAll(t, url, msgs[start:min(start+10, len(msgs))]...)
	}
}

// TestReceiveNAfterALostAnswer: when an answer is lost (its ten messages marked received by
// goaws, never seen by ReceiveN), ReceiveN gets them back within seconds, not after the
// queue's 30 s visibility, and returns all thirty once each, in send order, whether the first
// answer or a later one was lost; on a FIFO queue, the group's first message rather than its
// second. The
// next request waits 1.5 s, so that an SDK retry (which ReceiveN turns off) would lease the
// next ten on a later tick of goaws than the lost ones: their return would then not be
// noticed, and the lost ten would come last.
func TestReceiveNAfterALostAnswer(t *testing.T) {
	t.Parallel()
	for _, lost := range []int{1, 2} {
		t.Run(fmt.Sprintf("answer %d of 3", lost), func(t *testing.T) {
			t.Parallel()
			url := Queue(t, nil)
			msgs, want := numbered(30)
			Send(t, url, msgs...)
			api := &losingSQS{Client: Client(t), lose: map[int]bool{lost: true}, pauseAfterLoss: 1500 * time.Millisecond}
			start := time.Now()
			got := receiveN(t, api, url, len(want), 20*time.Second)
			t.Logf("%d messages in %s", len(got), time.Since(start).Round(time.Millisecond))
			require.Len(t, api.lostBodies(), 10, "the lost answer held ten messages")
			require.Equal(t, want, bodies(got))
			requireHeld(t, url, got, false)
		})
	}
	t.Run("FIFO", func(t *testing.T) {
		t.Parallel()
		url := FIFOQueue(t, nil)
		Send(t, url, Message{Body: "g-1", GroupID: "g", DeduplicationID: "1"}, Message{Body: "g-2", GroupID: "g", DeduplicationID: "2"})
		api := &losingSQS{Client: Client(t), lose: map[int]bool{1: true}}
		got := receiveN(t, api, url, 1, 10*time.Second)
		require.Equal(t, []string{"g-1"}, api.lostBodies())
		require.Equal(t, []string{"g-1"}, bodies(got))
		requireHeld(t, url, got, false)
	})
}

// TestReceiveNCountsARedeliveryOnce: an answer that comes back after the first answer's
// messages lapsed makes ReceiveN see those again; it counts each message once, still
// returns the thirty in send order, and holds them past its short lease.
func TestReceiveNCountsARedeliveryOnce(t *testing.T) {
	t.Parallel()
	url := Queue(t, nil)
	msgs, want := numbered(30)
	Send(t, url, msgs...)
	api := &losingSQS{Client: Client(t), slow: map[int]time.Duration{2: receiveLease + lapseMargin}}
	got := receiveN(t, api, url, len(want), 30*time.Second)
	require.Equal(t, want, bodies(got))
	requireHeld(t, url, got, true)
}

// losingDeletes is the test client, except that the first `lose` DeleteMessage requests are
// done by the queue but their answers lost, as goaws loses answers under load.
type losingDeletes struct {
	*sqs.Client
	lose int

	mu       sync.Mutex
	requests int
}

func (l *losingDeletes) DeleteMessage(ctx context.Context, in *sqs.DeleteMessageInput, opts ...func(*sqs.Options)) (*sqs.DeleteMessageOutput, error) {
	out, err := l.Client.DeleteMessage(ctx, in, opts...)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.requests++
	if err == nil && l.requests <= l.lose {
		return nil, &smithyhttp.RequestSendError{Err: fmt.Errorf("read tcp 127.0.0.1:1->127.0.0.1:2: use of closed network connection (answer %d lost by the test)", l.requests)}
	}
	return out, err
}

// TestDeleteAfterALostAnswer: a delete whose answer was lost is sent again, and the
// "message does not exist" it then gets is the lost attempt's success; the message does not come
// back. Without a lost answer, deleting a message that is gone fails the test.
func TestDeleteAfterALostAnswer(t *testing.T) {
	t.Parallel()
	url := Queue(t, map[string]string{"VisibilityTimeout": "1"})
	msgs, _ := numbered(2)
	Send(t, url, msgs...)
	got := ReceiveN(t, url, 2, 10*time.Second)
	api := &losingDeletes{Client: Client(t), lose: 1}
	deleteMessages(t, api, url, got)
	require.Equal(t, 3, api.requests, "the first delete sent twice, the second once")
	time.Sleep(time.Second + lapseMargin)
	require.Empty(t, Receive(t, url, 10, 0, 0), "both messages deleted")

	ft := &fatalRecorder{T: t}
	func() {
		defer func() { _ = recover() }()
		deleteMessages(ft, Client(t), url, got[:1])
	}()
	require.Contains(t, ft.msg, "does not contain the message", "a message gone before the first attempt is an error")
}

// fatalRecorder records a Fatalf and stops the function that called it (a panic, recovered
// by the test), where testing.T would end the test.
type fatalRecorder struct {
	*testing.T
	msg string
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic(f)
}

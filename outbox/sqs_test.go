package outbox

import (
	"context"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/sqstest"
)

func newSQSPublisher(t *testing.T, c sqsSender) *SQSPublisher {
	t.Helper()
	p, err := NewSQSPublisher(c)
	require.NoError(t, err)
	return p
}

func stringAttrs(m types.Message) map[string]string {
	out := map[string]string{}
	for k, v := range m.MessageAttributes {
		out[k] = aws.ToString(v.StringValue)
	}
	return out
}

func requireNoErrors(t *testing.T, errs []error) {
	t.Helper()
	for i, err := range errs {
		require.NoError(t, err, "event %d", i)
	}
}

// TestSQSPublisher: events become messages, in batches of at most ten, with the outbox headers
// as String attributes; a payload SQS cannot carry as text travels in base64 and says so.
func TestSQSPublisher(t *testing.T) {
	t.Parallel()
	url := sqstest.Queue(t, nil)
	name := url[strings.LastIndexByte(url, '/')+1:]
	p := newSQSPublisher(t, sqstest.Client(t))

	var events []Event
	for i := range 23 {
		topic := name // by name, resolved with GetQueueUrl
		if i%2 == 1 {
			topic = url // or by URL
		}
		events = append(events, testEvent(topic, "", fmt.Sprintf(`{"i":%d}`, i), 0))
	}
	binary := testEvent(name, "", "binary", 0)
	binary.Payload = []byte("\x00\xff binary")
	events = append(events, binary)
	events[0].Headers[HeaderCausationID] = "spoofed"
	requireNoErrors(t, p.Publish(context.Background(), events))

	got := sqstest.ReceiveN(t, url, len(events), 20*time.Second)
	byBody := map[string]types.Message{}
	for _, m := range got {
		byBody[aws.ToString(m.Body)] = m
	}
	require.Len(t, byBody, len(events))
	require.Equal(t, map[string]string{
		HeaderOperationID: events[0].OperationID.String(), HeaderCausationID: events[0].CausationID, HeaderPipeline: "pipe",
		HeaderContentType: "application/json", HeaderEventType: "order.paid", "traceparent": events[0].Headers["traceparent"],
	}, stringAttrs(byBody[`{"i":0}`]))
	encoded, ok := byBody[base64.StdEncoding.EncodeToString(binary.Payload)]
	require.True(t, ok, "the binary payload is sent in base64")
	require.Equal(t, "base64", stringAttrs(encoded)[HeaderBodyEncoding])
}

// TestSQSPublisherFIFO: on a FIFO queue the key is the MessageGroupId and the operation id the
// MessageDeduplicationId, so that a second publish of the same events (a relay that crashed
// before marking them) is dropped by SQS itself; a key's events keep their order.
func TestSQSPublisherFIFO(t *testing.T) {
	t.Parallel()
	url := sqstest.FIFOQueue(t, nil)
	p := newSQSPublisher(t, sqstest.Client(t))
	var events []Event
	for i := range 12 {
		events = append(events, testEvent(url, "order-7", strconv.Itoa(i), 0))
	}
	requireNoErrors(t, p.Publish(context.Background(), events))
	requireNoErrors(t, p.Publish(context.Background(), events[:5])) // the same operation ids

	var bodies []string
	for len(bodies) < len(events) {
		// goaws hands out one message of a group at a time (SQS may hand out several).
		got := sqstest.ReceiveN(t, url, 1, 10*time.Second)
		for _, m := range got {
			bodies = append(bodies, aws.ToString(m.Body))
			require.Equal(t, OperationID("pipe", "msg-"+aws.ToString(m.Body), 0).String(), stringAttrs(m)[HeaderOperationID])
		}
		sqstest.Delete(t, url, got...)
	}
	require.Equal(t, []string{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11"}, bodies)
	require.Empty(t, sqstest.Receive(t, url, 10, time.Second, 0), "the second publish was deduplicated")
}

func TestSQSGroupID(t *testing.T) {
	t.Parallel()
	e := testEvent("q.fifo", "order-7", "x", 0)
	require.Equal(t, "order-7", sqsGroupID(&e))
	e.Key = nil
	require.Equal(t, "pipe", sqsGroupID(&e), "no key: the pipeline's group")
	e.Key = []byte("a key with spaces")
	id := sqsGroupID(&e)
	require.True(t, strings.HasPrefix(id, "sha256-"))
	require.Len(t, id, 7+64)
	require.Equal(t, id, sqsGroupID(&e), "one key, one group")
}

// TestSQSPublisherRefusals: a missing queue, an event above the queue's size limit and one
// with more attributes than SQS takes fail permanently, each alone.
func TestSQSPublisherRefusals(t *testing.T) {
	t.Parallel()
	url := sqstest.Queue(t, map[string]string{"MaximumMessageSize": "1024"})
	p := newSQSPublisher(t, sqstest.Client(t))

	crowded := testEvent(url, "", "crowded", 0)
	for i := range 8 {
		crowded.Headers["h"+strconv.Itoa(i)] = "v"
	}
	events := []Event{
		testEvent(sqstest.Name(t), "", "missing queue by name", 0),
		testEvent(url+"-missing", "", "missing queue by URL", 0),
		testEvent(url, "", strings.Repeat("x", 2000), 0),
		crowded,
		testEvent(url, "", "fine", 0),
	}
	errs := p.Publish(context.Background(), events)
	require.ErrorIs(t, errs[0], ErrNoDestination)
	require.ErrorIs(t, errs[1], ErrNoDestination)
	require.ErrorIs(t, errs[1], ErrPermanent)
	require.ErrorIs(t, errs[2], ErrPermanent)
	require.ErrorContains(t, errs[2], "at most 1024")
	require.ErrorIs(t, errs[3], ErrPermanent)
	require.NotErrorIs(t, errs[3], ErrNoDestination)
	require.NoError(t, errs[4])
	require.Equal(t, "fine", aws.ToString(sqstest.ReceiveN(t, url, 1, 10*time.Second)[0].Body))
}

// TestSQSPublisherQueueRecreated: a queue deleted after the publisher resolved it fails as
// missing, and is resolved again once it exists.
func TestSQSPublisherQueueRecreated(t *testing.T) {
	t.Parallel()
	name := sqstest.Name(t)
	url := sqstest.CreateQueue(t, name, nil)
	c := sqstest.Client(t)
	p := newSQSPublisher(t, c)
	requireNoErrors(t, p.Publish(context.Background(), []Event{testEvent(name, "", "1", 0)}))
	_, err := c.DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: aws.String(url)})
	require.NoError(t, err)
	require.ErrorIs(t, p.Publish(context.Background(), []Event{testEvent(name, "", "2", 0)})[0], ErrNoDestination)
	url = sqstest.CreateQueue(t, name, nil)
	requireNoErrors(t, p.Publish(context.Background(), []Event{testEvent(name, "", "3", 0)}))
	require.Equal(t, "3", aws.ToString(sqstest.ReceiveN(t, url, 1, 10*time.Second)[0].Body))
}

// failEntries passes SendMessageBatch to the real SQS client but reports the entries whose
// body is in fail as failed (not the sender's fault) without sending them: a partial
// failure, which goaws never produces.
type failEntries struct {
	*sqs.Client
	fail map[string]bool
}

func (f failEntries) SendMessageBatch(ctx context.Context, in *sqs.SendMessageBatchInput, opts ...func(*sqs.Options)) (*sqs.SendMessageBatchOutput, error) {
	pass := *in
	pass.Entries = nil
	var failed []types.BatchResultErrorEntry
	for _, e := range in.Entries {
		if f.fail[aws.ToString(e.MessageBody)] {
			failed = append(failed, types.BatchResultErrorEntry{Id: e.Id, Code: aws.String("InternalError"), SenderFault: false})
			continue
		}
		pass.Entries = append(pass.Entries, e)
	}
	out := &sqs.SendMessageBatchOutput{}
	if len(pass.Entries) > 0 {
		var err error
		if out, err = f.Client.SendMessageBatch(ctx, &pass, opts...); err != nil {
			return nil, err
		}
	}
	out.Failed = append(out.Failed, failed...)
	return out, nil
}

// TestSQSPublisherGroupHeldAfterFailure: on a FIFO queue, once an event of a group failed,
// the group's later events in the round (in later batches) are not sent, so that the retry
// cannot be overtaken; other groups go on. A failure that is not the sender's is transient.
func TestSQSPublisherGroupHeldAfterFailure(t *testing.T) {
	t.Parallel()
	url := sqstest.FIFOQueue(t, nil)
	p := newSQSPublisher(t, failEntries{sqstest.Client(t), map[string]bool{"a-3": true}})
	var events []Event
	for i := range 15 {
		events = append(events, testEvent(url, "a", "a-"+strconv.Itoa(i), 0), testEvent(url, "b", "b-"+strconv.Itoa(i), 0))
	}
	errs := p.Publish(context.Background(), events)
	sent := map[string]bool{}
	for i, err := range errs {
		body := string(events[i].Payload)
		n, _ := strconv.Atoi(body[2:])
		switch {
		case body[0] == 'b', n < 3:
			require.NoError(t, err, body)
			sent[body] = true
		case n == 3:
			require.Error(t, err)
			require.NotErrorIs(t, err, ErrPermanent)
		case n >= 5: // a-4 shared a batch with a-3; the later batches hold group a back
			require.ErrorContains(t, err, "earlier event of key", body)
		}
	}
	// Group a is held back by goaws until a-0 is deleted; group b's first is out.
	seen := map[string]bool{}
	for _, m := range sqstest.ReceiveN(t, url, 2, 10*time.Second) {
		seen[aws.ToString(m.Body)] = true
	}
	require.Equal(t, map[string]bool{"a-0": true, "b-0": true}, seen)
}

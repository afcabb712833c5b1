// Package sqstest gives tests an SQS endpoint, an aws-sdk-go-v2 client on it, and queues unique
// to each test. The endpoint is TEST_SQS_ENDPOINT when set (any SQS that speaks the JSON
// protocol), else the in-process goaws of internal/sqsfake, started on first use and shared by
// the whole test binary. Queues are deleted at cleanup.
package sqstest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"

	"github.com/idemd/idemd/internal/sqsfake"
	"github.com/idemd/idemd/internal/testname"
)

var (
	once     sync.Once
	endpoint string
	kind     string
	startErr error
)

// Endpoint returns the SQS endpoint of the tests, starting the fake on first use.
func Endpoint(tb testing.TB) string {
	tb.Helper()
	once.Do(func() {
		if e := os.Getenv("TEST_SQS_ENDPOINT"); e != "" {
			endpoint, kind = e, "env"
			return
		}
		s, err := sqsfake.Start("127.0.0.1:0")
		if err != nil {
			startErr = err
			return
		}
		// The fake lives as long as the test binary: it is in memory only.
		endpoint, kind = s.URL(), "goaws"
	})
	if startErr != nil {
		tb.Fatalf("sqstest: no SQS: %v", startErr)
	}
	return endpoint
}

// Kind says which SQS Endpoint returned: "env" or "goaws". Tests of behaviour goaws lacks
// skip on "goaws" and say why.
func Kind(tb testing.TB) string {
	tb.Helper()
	Endpoint(tb)
	return kind
}

var (
	clientOnce sync.Once
	client     *sqs.Client
)

// Client returns the SQS client on the test endpoint, with static test credentials: one for
// the whole test binary, so that its connections are reused (a client per call would open
// connections of its own, kept idle for 90 s, until the process runs out of descriptors).
func Client(tb testing.TB) *sqs.Client {
	tb.Helper()
	endpoint := Endpoint(tb)
	clientOnce.Do(func() {
		client = sqs.New(sqs.Options{
			Region:       sqsfake.Region,
			BaseEndpoint: aws.String(endpoint),
			Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
		})
	})
	return client
}

var unsafeName = regexp.MustCompile(`[^a-zA-Z0-9_-]+`)

// Name returns a queue name unique to this test and this run (without the .fifo suffix):
// SQS names are at most 80 characters of letters, digits, '-' and '_'.
func Name(tb testing.TB) string {
	tb.Helper()
	return testname.Unique(tb, unsafeName, 60)
}

// Queue creates a standard queue unique to this test and returns its URL. attrs are SQS
// queue attributes, such as "VisibilityTimeout": "5".
func Queue(tb testing.TB, attrs map[string]string) string {
	tb.Helper()
	return CreateQueue(tb, Name(tb), attrs)
}

// FIFOQueue creates a FIFO queue unique to this test and returns its URL.
func FIFOQueue(tb testing.TB, attrs map[string]string) string {
	tb.Helper()
	a := map[string]string{"FifoQueue": "true"}
	for k, v := range attrs {
		a[k] = v
	}
	return CreateQueue(tb, Name(tb)+".fifo", a)
}

// CreateQueue creates the named queue and deletes it at cleanup.
func CreateQueue(tb testing.TB, name string, attrs map[string]string) string {
	tb.Helper()
	c := Client(tb)
	out, err := c.CreateQueue(ctx(tb), &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs})
	if err != nil {
		tb.Fatalf("sqstest: creating queue %s: %v", name, err)
	}
	url := aws.ToString(out.QueueUrl)
	tb.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = c.DeleteQueue(cctx, &sqs.DeleteQueueInput{QueueUrl: aws.String(url)})
	})
	return url
}

// QueueARN returns the queue's ARN, for a RedrivePolicy.
func QueueARN(tb testing.TB, url string) string {
	tb.Helper()
	out, err := Client(tb).GetQueueAttributes(ctx(tb), &sqs.GetQueueAttributesInput{
		QueueUrl: aws.String(url), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn},
	})
	if err != nil {
		tb.Fatalf("sqstest: reading the ARN of %s: %v", url, err)
	}
	return out.Attributes[string(types.QueueAttributeNameQueueArn)]
}

// Message is one message to Send.
type Message struct {
	Body       string
	Attributes map[string]string // String message attributes
	// GroupID and DeduplicationID are for FIFO queues.
	GroupID, DeduplicationID string
}

// Send sends msgs with SendMessageBatch, ten at a time, and fails the test on any failure.
// It returns the broker's message ids.
func Send(tb testing.TB, url string, msgs ...Message) []string {
	tb.Helper()
	c := Client(tb)
	var ids []string
	for start := 0; start < len(msgs); start += 10 {
		chunk := msgs[start:min(start+10, len(msgs))]
		entries := make([]types.SendMessageBatchRequestEntry, len(chunk))
		for i, m := range chunk {
			e := types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), MessageBody: aws.String(m.Body)}
			if m.GroupID != "" {
				e.MessageGroupId = aws.String(m.GroupID)
			}
			if m.DeduplicationID != "" {
				e.MessageDeduplicationId = aws.String(m.DeduplicationID)
			}
			if len(m.Attributes) > 0 {
				e.MessageAttributes = StringAttributes(m.Attributes)
			}
			entries[i] = e
		}
		out, err := c.SendMessageBatch(ctx(tb), &sqs.SendMessageBatchInput{QueueUrl: aws.String(url), Entries: entries})
		if err != nil {
			tb.Fatalf("sqstest: sending to %s: %v", url, err)
		}
		if len(out.Failed) > 0 {
			tb.Fatalf("sqstest: sending to %s: %d entries failed, first: %s", url, len(out.Failed), aws.ToString(out.Failed[0].Message))
		}
		byID := map[string]string{}
		for _, s := range out.Successful {
			byID[aws.ToString(s.Id)] = aws.ToString(s.MessageId)
		}
		for i := range chunk {
			ids = append(ids, byID[strconv.Itoa(i)])
		}
	}
	return ids
}

// StringAttributes turns a map into SQS message attributes of type String.
func StringAttributes(m map[string]string) map[string]types.MessageAttributeValue {
	out := make(map[string]types.MessageAttributeValue, len(m))
	for k, v := range m {
		out[k] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
	}
	return out
}

// Receive makes one ReceiveMessage call for up to max messages (at most 10), waiting up to
// wait for the first, with every attribute; visibility 0 keeps the queue's default.
func Receive(tb testing.TB, url string, max int, wait, visibility time.Duration) []types.Message {
	tb.Helper()
	msgs, err := receive(ctx(tb), Client(tb), url, max, wait, visibility)
	if err != nil {
		tb.Fatalf("sqstest: receiving from %s: %v", url, err)
	}
	return msgs
}

func receive(c context.Context, api sqsAPI, url string, max int, wait, visibility time.Duration, opts ...func(*sqs.Options)) ([]types.Message, error) {
	out, err := api.ReceiveMessage(c, &sqs.ReceiveMessageInput{
		QueueUrl:                    aws.String(url),
		MaxNumberOfMessages:         int32(max),
		WaitTimeSeconds:             int32(wait / time.Second),
		VisibilityTimeout:           int32(visibility / time.Second),
		MessageAttributeNames:       []string{"All"},
		MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
	}, opts...)
	if err != nil {
		return nil, err
	}
	return out.Messages, nil
}

// Delete deletes msgs, received from url, one DeleteMessage each, and fails the test if one
// is not deleted. goaws can lose a DeleteMessage answer as it loses ReceiveMessage answers
// (ReceiveN): the SDK's retry of a delete that had been done would fail with
// MessageDoesNotExist. Delete sends the request again itself instead, and takes that answer,
// after a lost one, for the message deleted by the lost attempt; on a first attempt it is an
// error.
func Delete(tb testing.TB, url string, msgs ...types.Message) {
	tb.Helper()
	deleteMessages(tb, Client(tb), url, msgs)
}

func deleteMessages(tb testing.TB, api sqsAPI, url string, msgs []types.Message) {
	tb.Helper()
	noRetry := func(o *sqs.Options) { o.RetryMaxAttempts = 1 }
	retryable := retry.IsErrorRetryables(retry.DefaultRetryables)
	for _, m := range msgs {
		var lost error
		for attempt := 1; ; attempt++ {
			_, err := api.DeleteMessage(ctx(tb), &sqs.DeleteMessageInput{QueueUrl: aws.String(url), ReceiptHandle: m.ReceiptHandle}, noRetry)
			switch {
			case err == nil:
			case lost != nil && slices.Contains(messageGone, apiErrorCode(err)):
				// the lost attempt deleted it
			case retryable.IsErrorRetryable(err) == aws.TrueTernary && attempt < 5:
				lost = err
				continue
			default:
				tb.Fatalf("sqstest: deleting message %s from %s (attempt %d, after %v): %v", aws.ToString(m.MessageId), url, attempt, lost, err)
			}
			break
		}
	}
}

// messageGone are the error codes of a DeleteMessage whose message is not in the queue:
// goaws v0.5.4 answers MessageDoesNotExist with the code AWS.SimpleQueueService.QueueExists
// ("The specified queue does not contain the message specified", HTTP 404).
var messageGone = []string{"MessageDoesNotExist", "ReceiptHandleIsInvalid", "AWS.SimpleQueueService.QueueExists"}

// apiErrorCode is the error code of the service's answer in err, "" when there is none.
func apiErrorCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// sqsAPI is what ReceiveN and Delete call: the test client, or a test's wrapper of it that
// loses answers.
type sqsAPI interface {
	DeleteMessage(context.Context, *sqs.DeleteMessageInput, ...func(*sqs.Options)) (*sqs.DeleteMessageOutput, error)
	ReceiveMessage(context.Context, *sqs.ReceiveMessageInput, ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error)
	ChangeMessageVisibility(context.Context, *sqs.ChangeMessageVisibilityInput, ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityOutput, error)
	GetQueueAttributes(context.Context, *sqs.GetQueueAttributesInput, ...func(*sqs.Options)) (*sqs.GetQueueAttributesOutput, error)
}

const (
	// receiveLease is the visibility ReceiveN receives with, until it holds every message.
	receiveLease = 3 * time.Second
	// lapseMargin is how long after a lease's end ReceiveN counts on the message being
	// visible again: goaws makes it so on a 1-second tick, which a loaded test binary may run
	// late.
	lapseMargin = 2 * time.Second
)

// ReceiveN receives until it holds n distinct messages, and returns them in the order the
// queue handed them out, in flight: invisible to other receives, their receipt handles valid,
// for the queue's VisibilityTimeout from the moment ReceiveN returns (so that a caller can
// delete them or change their visibility, and a FIFO group stays locked meanwhile). It fails
// the test if it does not hold n within timeout.
//
// goaws v0.5.4 loses ReceiveMessage answers under load (BENCHMARKS.md): an attempt fails in
// the SDK ("deserialization failed … use of closed network connection") after goaws marked
// its messages received, and the SDK's retry gets the next ones. Received under the queue's
// visibility (30 s by default), the lost ones would stay invisible longer than a test waits.
// So ReceiveN receives with a short visibility (3 s, or the queue's when shorter), which it
// extends to the queue's only once it holds all n, and without the SDK's retry, so that it
// sees the failure. A message it sees a second time is the same message (its lease lapsed,
// or SQS delivered it twice: MessageId is the same) and is counted once.
//
// Order: goaws hands out a standard queue's messages in send order, from the first visible
// one, and tests check that order; lost messages that came back after later ones would break
// it. After a lost answer, a message seen again, or a lease it cannot extend, ReceiveN
// therefore forgets what it holds, waits until every lease it (or the lost attempt) took has
// lapsed, and receives them all again: what it returns comes from one pass. On a queue with a
// RedrivePolicy each such lapse counts as a receive. A receive error the SDK would retry is
// taken for a lost answer; any other (such as a missing queue) fails the test at once.
func ReceiveN(tb testing.TB, url string, n int, timeout time.Duration) []types.Message {
	tb.Helper()
	return receiveN(tb, Client(tb), url, n, timeout)
}

func receiveN(tb testing.TB, api sqsAPI, url string, n int, timeout time.Duration) []types.Message {
	tb.Helper()
	if n <= 0 {
		return nil
	}
	deadline := time.Now().Add(timeout)
	hold := queueVisibility(tb, api, url)
	lease := min(receiveLease, hold)
	noRetry := func(o *sqs.Options) { o.RetryMaxAttempts = 1 }
	retryable := retry.IsErrorRetryables(retry.DefaultRetryables)
	var (
		got      []types.Message
		seen     = map[string]bool{}
		leased   time.Time // when the last lease was taken: every lease has lapsed by leased+lease+lapseMargin
		restarts int
		lastErr  error
	)
	startOver := func(why string) {
		restarts++
		tb.Logf("sqstest: %s on %s, holding %d of %d messages: receiving them all again once their leases lapse", why, url, len(got), n)
		got, seen = nil, map[string]bool{}
		time.Sleep(min(time.Until(leased.Add(lease+lapseMargin)), time.Until(deadline)))
	}
	for {
		for len(got) < n {
			if time.Now().After(deadline) {
				tb.Fatalf("sqstest: received %d of %d messages from %s within %s (started over %d times; last error: %v)", len(got), n, url, timeout, restarts, lastErr)
			}
			msgs, err := receive(ctx(tb), api, url, min(10, n-len(got)), time.Second, lease, noRetry)
			leased = time.Now()
			if err != nil {
				if retryable.IsErrorRetryable(err) != aws.TrueTernary {
					tb.Fatalf("sqstest: receiving from %s: %v", url, err)
				}
				lastErr = err
				startOver(fmt.Sprintf("an answer was lost (%v)", err))
				continue
			}
			if slices.ContainsFunc(msgs, func(m types.Message) bool { return seen[aws.ToString(m.MessageId)] }) {
				startOver("a message came again (its lease lapsed)")
				continue
			}
			for _, m := range msgs {
				seen[aws.ToString(m.MessageId)] = true
				got = append(got, m)
			}
		}
		if lease == hold {
			return got // received under the queue's own visibility
		}
		i, err := changeVisibility(tb, api, url, got, hold)
		if err == nil {
			return got
		}
		lastErr = err
		// Those already extended go back to a short lease, to lapse with the rest.
		if _, rerr := changeVisibility(tb, api, url, got[:i], lease); rerr != nil {
			lastErr = rerr
		}
		leased = time.Now()
		startOver(fmt.Sprintf("a lease could not be extended (%v)", err))
	}
}

// queueVisibility returns the queue's VisibilityTimeout.
func queueVisibility(tb testing.TB, api sqsAPI, url string) time.Duration {
	tb.Helper()
	out, err := api.GetQueueAttributes(ctx(tb), &sqs.GetQueueAttributesInput{
		QueueUrl: aws.String(url), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameVisibilityTimeout},
	})
	if err != nil {
		tb.Fatalf("sqstest: reading the VisibilityTimeout of %s: %v", url, err)
	}
	s := out.Attributes[string(types.QueueAttributeNameVisibilityTimeout)]
	secs, err := strconv.Atoi(s)
	if err != nil {
		tb.Fatalf("sqstest: the VisibilityTimeout of %s is %q", url, s)
	}
	return time.Duration(secs) * time.Second
}

// changeVisibility sets the visibility of msgs, in order, and returns the index of the first
// it could not change, with the error.
func changeVisibility(tb testing.TB, api sqsAPI, url string, msgs []types.Message, visibility time.Duration) (int, error) {
	tb.Helper()
	for i, m := range msgs {
		_, err := api.ChangeMessageVisibility(ctx(tb), &sqs.ChangeMessageVisibilityInput{
			QueueUrl: aws.String(url), ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: int32(visibility / time.Second),
		})
		if err != nil {
			return i, fmt.Errorf("message %s: %w", aws.ToString(m.MessageId), err)
		}
	}
	return len(msgs), nil
}

func ctx(tb testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	tb.Cleanup(cancel)
	return c
}

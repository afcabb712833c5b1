// Package sqstest gives tests an SQS endpoint, an aws-sdk-go-v2 client on it, and queues unique
// to each test. The endpoint is TEST_SQS_ENDPOINT when set (any SQS that speaks the JSON
// protocol), else the in-process goaws of internal/sqsfake, started on first use and shared by
// the whole test binary. Queues are deleted at cleanup.
package sqstest

import (
	"context"
	"os"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

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
	out, err := Client(tb).ReceiveMessage(ctx(tb), &sqs.ReceiveMessageInput{
		QueueUrl:                    aws.String(url),
		MaxNumberOfMessages:         int32(max),
		WaitTimeSeconds:             int32(wait / time.Second),
		VisibilityTimeout:           int32(visibility / time.Second),
		MessageAttributeNames:       []string{"All"},
		MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
	})
	if err != nil {
		tb.Fatalf("sqstest: receiving from %s: %v", url, err)
	}
	return out.Messages
}

// ReceiveN receives until it holds n messages, failing the test after timeout.
func ReceiveN(tb testing.TB, url string, n int, timeout time.Duration) []types.Message {
	tb.Helper()
	var got []types.Message
	deadline := time.Now().Add(timeout)
	for len(got) < n {
		if time.Now().After(deadline) {
			tb.Fatalf("sqstest: received %d of %d messages from %s within %s", len(got), n, url, timeout)
		}
		got = append(got, Receive(tb, url, min(10, n-len(got)), time.Second, 0)...)
	}
	return got
}

func ctx(tb testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	tb.Cleanup(cancel)
	return c
}

package sqstest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
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

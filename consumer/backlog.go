package consumer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemd/idemd/internal/metrics"
)

// ErrBacklogUnknown is Backlog's answer for a subscription whose broker does not report a
// backlog to its client: Kafka (LagMonitor reads the consumer lag instead) and Pub/Sub
// (Cloud Monitoring has it: subscription/num_undelivered_messages and
// subscription/oldest_unacked_message_age).
var ErrBacklogUnknown = errors.New("the broker does not report this subscription's backlog to its client")

// Backlog returns how many messages of an SQS subscription's queue are not yet deleted:
// visible (ApproximateNumberOfMessages) and received but not deleted
// (ApproximateNumberOfMessagesNotVisible), as SQS approximates them. It needs SQSClient, not
// a running consumer. Other doors answer ErrBacklogUnknown.
func (c *Consumer) Backlog(ctx context.Context) (int64, error) {
	if c.cfg.Door() != DoorSQS {
		return 0, ErrBacklogUnknown
	}
	if c.cfg.SQSClient == nil {
		return 0, errors.New("SQSClient is required to read the backlog of an SQS subscription")
	}
	url, err := c.queueURL(ctx)
	if err != nil {
		return 0, err
	}
	out, err := c.cfg.SQSClient.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl: aws.String(url),
		AttributeNames: []types.QueueAttributeName{
			types.QueueAttributeNameApproximateNumberOfMessages, types.QueueAttributeNameApproximateNumberOfMessagesNotVisible,
		},
	})
	if err != nil {
		return 0, fmt.Errorf("error reading the attributes of SQS queue %s: %w", url, err)
	}
	var n int64
	for _, name := range []types.QueueAttributeName{
		types.QueueAttributeNameApproximateNumberOfMessages, types.QueueAttributeNameApproximateNumberOfMessagesNotVisible,
	} {
		v, ok := out.Attributes[string(name)]
		if !ok {
			return 0, fmt.Errorf("SQS queue %s: no %s in GetQueueAttributes' answer", url, name)
		}
		i, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("SQS queue %s: %s is %q, not a number", url, name, v)
		}
		n += i
	}
	return n, nil
}

// queueURL resolves the SQS queue once (GetQueueUrl for a name).
func (c *Consumer) queueURL(ctx context.Context) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sqsURL != "" {
		return c.sqsURL, nil
	}
	q := c.cfg.SQS.Queue
	if strings.Contains(q, "://") {
		c.sqsURL = q
		return q, nil
	}
	out, err := c.cfg.SQSClient.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(q)})
	if err != nil {
		return "", fmt.Errorf("error resolving SQS queue %s: %w", q, err)
	}
	c.sqsURL = aws.ToString(out.QueueUrl)
	return c.sqsURL, nil
}

// watchBacklog exports idemd_subscription_backlog every BacklogInterval until ctx ends or
// stop is called, which deletes the series.
func (c *Consumer) watchBacklog(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(c.cfg.BacklogInterval)
		defer t.Stop()
		failing := false
		for {
			rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
			n, err := c.Backlog(rctx)
			rcancel()
			switch {
			case ctx.Err() != nil:
				return
			case err == nil:
				metrics.SubscriptionBacklog.WithLabelValues(c.cfg.Name).Set(float64(n))
			case !failing:
				c.log.WithError(err).Warn("error reading the subscription's backlog; retrying")
			}
			failing = err != nil
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() {
		cancel()
		<-done
		metrics.SubscriptionBacklog.DeleteLabelValues(c.cfg.Name)
	}
}

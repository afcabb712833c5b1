package consumer

import (
	"context"
	"time"
)

// The Pub/Sub and SQS doors are built from the pieces in this file, pubsub.go and sqs.go: a
// brokerSource per subscription, which the broker-neutral core (brokerrun.go) drives.

// brokerMessage is one delivered message of a Pub/Sub or SQS subscription, plain data for
// the core; handle is the adapter's own (a *pubsub.Message, an SQS receipt handle).
type brokerMessage struct {
	// ID is the broker's message id (Pub/Sub messageId, SQS MessageId): stable across
	// redeliveries of one message, new for each publish (a producer's retry included).
	ID string
	// Ordered messages of one Lane must be applied in delivery order: Lane is the Pub/Sub
	// ordering key or the SQS FIFO MessageGroupId (empty when goaws, which omits it, or
	// SQS was not asked for it: then the queue is one lane). Unordered messages (Pub/Sub
	// without an ordering key, SQS standard queues) may be applied in any order.
	Ordered bool
	Lane    string
	// Body is the message data (an SQS body sent in base64 by idemd's publisher is decoded).
	Body []byte
	// Attributes are the Pub/Sub attributes, or the SQS String and Number message
	// attributes.
	Attributes map[string]string
	// PublishTime is when the broker took the message (SQS SentTimestamp).
	PublishTime time.Time
	// DeliveryAttempt counts deliveries, this one included, where the broker says (Pub/Sub
	// with a dead-letter policy, SQS ApproximateReceiveCount); 0 when it does not.
	DeliveryAttempt int
	// ReceivedAt is when this process received it.
	ReceivedAt time.Time

	handle any
}

// brokerSource is a Pub/Sub subscription or an SQS queue as the core sees it. Every message
// Receive returns is leased to the caller (its ack deadline or visibility is extended) until
// Ack or Release, or until MaxExtension has passed since it was received; then the broker
// redelivers it.
type brokerSource interface {
	// Receive waits for messages and returns at least one, in delivery order, or ctx's
	// error. The next message of an ordered lane may come before the previous one was
	// acknowledged: the core keeps each lane's order, and releases the messages it holds
	// behind a released one of the same lane.
	Receive(ctx context.Context) ([]*brokerMessage, error)
	// Ack acknowledges messages whose transaction committed (Pub/Sub Ack, SQS
	// DeleteMessageBatch). An error means some acknowledgement may not have reached the
	// broker: those messages come again, and their ids deduplicate them.
	Ack(ctx context.Context, msgs []*brokerMessage) error
	// Release gives messages back for redelivery without acknowledging them (Pub/Sub
	// Nack, SQS ChangeMessageVisibility to RetryDelay): never a delete.
	Release(ctx context.Context, msgs []*brokerMessage) error
	// Close stops receiving and releases what is still held. Safe to call twice.
	Close() error
}

package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Publisher publishes outbox events to one kind of broker (PubSubPublisher, SQSPublisher).
// The relay hands it a round of events read in outbox order, with OperationID set, and marks
// published exactly the events whose error is nil: the broker acknowledged them.
//
// Events of one (Topic, Key) are published in the order given. When one of them fails, the
// later ones of that (Topic, Key) in the same call are not published and fail too (not
// permanently), so that a retry cannot overtake them. Errors wrap ErrPermanent when the
// broker will refuse the event on every attempt (too large, invalid), and ErrNoDestination as
// well when the topic or queue does not exist; any other error is transient.
type Publisher interface {
	Publish(ctx context.Context, events []Event) []error
	// Close flushes and releases the publisher's resources; it does not close the client it
	// was given.
	Close() error
}

var (
	// ErrPermanent marks a publish failure that retrying cannot mend: the broker refuses
	// the event itself, or its destination does not exist.
	ErrPermanent = errors.New("refused for good")
	// ErrNoDestination marks a publish failure because the topic or queue does not exist
	// (idemd creates none outside `idemd dev`). It also matches ErrPermanent; a relay may
	// rather hold the destination's events until an operator creates it.
	ErrNoDestination = errors.New("no such topic or queue")
)

// publishError is one event's failure, classified.
type publishError struct {
	err                   error
	permanent, noSuchDest bool
}

func (e *publishError) Error() string { return e.err.Error() }
func (e *publishError) Unwrap() error { return e.err }
func (e *publishError) Is(target error) bool {
	return (target == ErrPermanent && (e.permanent || e.noSuchDest)) || (target == ErrNoDestination && e.noSuchDest)
}

func permanent(format string, args ...any) error {
	return &publishError{err: fmt.Errorf(format, args...), permanent: true}
}

func noDestination(err error) error { return &publishError{err: err, noSuchDest: true} }

// keyFailed is the error of an event held back because an earlier event of its key failed.
func keyFailed(topic string, key []byte) error { return &heldError{topic: topic, key: key} }

// heldError is an event not sent because an earlier event of its key failed in the same
// call: it failed for no fault of its own, and is sent again after that earlier one.
type heldError struct {
	topic string
	key   []byte
}

func (e *heldError) Error() string {
	return fmt.Sprintf("not published: an earlier event of key %q on %s failed in the same round", e.key, e.topic)
}

// heldBack reports whether err is a heldError.
func heldBack(err error) bool {
	var h *heldError
	return errors.As(err, &h)
}

// attributes are the message attributes of e: the record headers of the Kafka path, ours
// winning over e.Headers.
func attributes(e *Event) map[string]string {
	a := make(map[string]string, 3+len(e.Headers))
	for k, v := range e.Headers {
		a[k] = v
	}
	a[HeaderOperationID] = e.OperationID.String()
	a[HeaderCausationID] = e.CausationID
	a[HeaderPipeline] = e.Pipeline
	return a
}

// checkPublishable reports what makes e impossible to publish, whatever the broker.
func checkPublishable(e *Event) error {
	switch {
	case e.Topic == "":
		return permanent("outbox event has no topic")
	case e.OperationID == uuid.Nil:
		return permanent("outbox event has no operation id")
	}
	return nil
}

// denied reports whether a broker refused a publish because the relay may not write to the
// topic or queue (Pub/Sub PERMISSION_DENIED, SQS AccessDenied): like a missing destination,
// an operator must act, so it counts towards the relay's MaxFailingFor. Failed
// authentication (bad credentials) is not this: it fails every destination alike.
func denied(err error) bool {
	if s, ok := status.FromError(err); ok && s.Code() == codes.PermissionDenied {
		return true
	}
	switch sqsErrorCode(err) {
	case "AccessDenied", "AccessDeniedException":
		return true
	}
	return false
}

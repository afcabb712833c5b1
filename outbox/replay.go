package outbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/deadletter"
)

// RegisterReplay tells rp how the relay's letters (deadletter.DoorRelay: events the broker
// refused) are replayed, once the cause is fixed (the topic's max.message.bytes, the queue's
// MaximumMessageSize, the topic or queue itself): the event goes back to the outbox with its
// destination (a Kafka topic, "pubsub:…", "sqs:…"), key and operation id, and the letter is
// marked replayed, in one transaction under the letter's lock.
func (s *Store) RegisterReplay(rp *deadletter.Replayer) {
	rp.Register(deadletter.DoorRelay, "", s.replay)
}

func (s *Store) replay(ctx context.Context, tx pgx.Tx, l *deadletter.Letter) (deadletter.Replayed, error) {
	topic, _ := l.Metadata["topic"].(string)
	op := l.Origin.OperationID
	if topic == "" || op == [16]byte{} {
		return deadletter.Replayed{}, fmt.Errorf("dead letter %d names no topic or operation id", l.ID)
	}
	ev := Event{Topic: topic, Payload: l.Payload, Pipeline: l.Pipeline, CausationID: l.MessageID, OperationID: op, Headers: map[string]string{}}
	if k, _ := l.Metadata["key"].(string); k != "" {
		ev.Key = []byte(k)
	}
	for k, v := range l.Headers {
		switch k {
		case HeaderOperationID, HeaderCausationID, HeaderPipeline:
		default: // the relay sets those three again
			if len(v) > 0 {
				ev.Headers[k] = v[0]
			}
		}
	}
	if err := s.EnqueueTx(ctx, tx, ev); err != nil {
		return deadletter.Replayed{}, err
	}
	kind, name := ParseDestination(topic)
	noun := "topic"
	if kind != DestinationKafka {
		noun = destinationNoun(kind)
	}
	return deadletter.Replayed{
		Outcome: deadletter.ReplayRequeued,
		Done:    fmt.Sprintf("event requeued to %s %q with the same operation id %s", noun, name, op),
	}, nil
}

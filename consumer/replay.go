package consumer

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/idemd/idemd/deadletter"
)

// ErrUnknownPipeline: the dead letter was not written by this subscription.
var ErrUnknownPipeline = errors.New("dead letter does not belong to this subscription")

// RegisterReplay tells rp how this subscription's letters (deadletter.DoorKafka) are
// replayed, once the cause was fixed: the record is rebuilt from the letter and applied
// through the unit of work again — the stale guard (when Order is set), the SQL effect, the
// Handler and the publish events, whose operation ids are the ones the originals would have
// had (outbox.TargetOperationID(pipeline, message id, target)), so a downstream consumer
// deduplicates them against earlier copies. Nothing is read from Kafka, so replays need no broker and work on
// a Consumer that never ran.
//
// A record that was dead-lettered for having no message id is replayed only when the
// pipeline's MessageID now finds one in it; that id is then claimed like a consumed
// record's, so a record already applied under it is not applied again.
//
// A Pub/Sub or SQS subscription registers its own door (deadletter.DoorPubSub,
// deadletter.DoorSQS) and replays its letters the same way, without its broker: the message
// is rebuilt from the letter (body, attributes, ordering key or group id, broker id).
//
// A replay that commits counts as the subscription's messages do when consumed: applied
// (idemd_messages_processed_total) or stale (idemd_messages_stale_total), and in
// idemd_dead_letters_replayed_total (deadletter.Replayer.Replay).
func (c *Consumer) RegisterReplay(rp *deadletter.Replayer) {
	door := deadletter.Door(c.cfg.Door())
	rp.Register(door, c.cfg.Name, c.replay)
	rp.Expect(door, c.cfg.Name, deadletter.ReplayApplied, deadletter.ReplayStale)
}

func (c *Consumer) replay(ctx context.Context, tx pgx.Tx, l *deadletter.Letter) (deadletter.Replayed, error) {
	if l.Pipeline != c.cfg.Name || l.Scope != c.cfg.Name {
		return deadletter.Replayed{}, fmt.Errorf("dead letter %d (pipeline %q, scope %q): %w", l.ID, l.Pipeline, l.Scope, ErrUnknownPipeline)
	}
	r := replayRecord(c.cfg.Name, l)
	if door := c.cfg.Door(); door != DoorKafka {
		r = replayBrokerRecord(c.cfg.Name, door, l)
	}
	// The id it was dead-lettered under, whatever the pipeline would read now; or, for a
	// letter without one, the id the pipeline finds now, claimed as new.
	id, ok, claim := l.MessageID, true, l.MessageID == ""
	if claim {
		id, ok = r.id(c.cfg.MessageID)
	}
	m := c.messageWithID(new(unitMessage), r, id, ok)
	if m.Invalid != nil {
		if errors.Is(m.Invalid, ErrNoMessageID) {
			return deadletter.Replayed{}, fmt.Errorf("dead letter %d: the pipeline still finds no message id in the record: %w", l.ID, m.Invalid)
		}
		if errors.Is(m.Invalid, ErrMalformedMessageID) {
			return deadletter.Replayed{}, fmt.Errorf("dead letter %d: the record's message id cannot be claimed: %w", l.ID, m.Invalid)
		}
	}
	outcome, err := c.unit.ReplayTx(ctx, tx, m, claim)
	if err != nil {
		return deadletter.Replayed{}, fmt.Errorf("error replaying dead letter %d: %w", l.ID, err)
	}
	// Debug, and worded so: the replay's transaction has not committed yet. The admin API
	// (or the CLI) logs the replay once it has, with its audit.
	c.log.WithField("dead_letter", l.ID).WithField("message_id", m.ID).WithField("outcome", m.Outcome.String()).Debug("dead letter's message applied in the replay's transaction")
	done := fmt.Sprintf("replayed through subscription %q", c.cfg.Name)
	if outcome == deadletter.ReplayStale {
		done += ": stale message, effect skipped"
	}
	return deadletter.Replayed{Outcome: outcome, Done: done}, nil
}

// replayRecord rebuilds a dead-lettered record from the letter the consumer wrote
// (letter): value, headers (the first of repeated ones wins, as when consumed), key, topic,
// partition, offset and timestamp. ReceivedAt is when the letter was written.
func replayRecord(pipeline string, l *deadletter.Letter) *record {
	rec := deadletter.RecordOf(l)
	m := kafka.Message{
		Value: l.Payload, Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset, Key: rec.Key, Time: rec.Time,
	}
	for _, h := range rec.Headers {
		m.Headers = append(m.Headers, kafka.Header(h))
	}
	return newRecord(pipeline, m, l.CreatedAt)
}

// replayBrokerRecord rebuilds a dead-lettered Pub/Sub or SQS message from its letter
// (letter): body, attributes, ordering key or group id, broker id, subscription and publish
// time. ReceivedAt is when the letter was written.
func replayBrokerRecord(pipeline, door string, l *deadletter.Letter) *record {
	rec := deadletter.RecordOf(l)
	m := &brokerMessage{
		ID: rec.BrokerMessageID, Lane: string(rec.Key), Body: l.Payload, Attributes: rec.Attributes,
		DeliveryAttempt: rec.DeliveryAttempt, Ordered: rec.Ordered, PublishTime: rec.Time, ReceivedAt: l.CreatedAt,
	}
	return newBrokerRecord(pipeline, door, rec.Subscription, m)
}

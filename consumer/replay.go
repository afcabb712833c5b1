package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/internal/fingerprint"
	"github.com/idemd/idemd/processed"
)

// ErrAlreadyReplayed: the dead letter was replayed before; its effect is not run again.
var ErrAlreadyReplayed = deadletter.ErrAlreadyReplayed

// ErrUnknownPipeline: the dead letter was not written by this subscription (another
// pipeline's, or an HTTP delivery's).
var ErrUnknownPipeline = errors.New("dead letter does not belong to this subscription")

// Replay runs a dead-lettered record through this subscription's pipeline again, for
// `idemd dlq replay`, once the cause was fixed: the stale guard (when Order is set), the SQL
// effect, the Handler and the publish event, whose operation id is the one the original
// would have had (outbox.OperationID(pipeline, message id, 0)), so a downstream consumer
// deduplicates it against an earlier copy. The record is rebuilt from the letter; nothing is
// read from Kafka, so Replay needs no broker and works on a Consumer that never ran.
//
// Exactly once: the letter is locked, the effect runs and the letter is marked replayed in
// one transaction, so two replays of one letter apply it once (the second gets
// ErrAlreadyReplayed). A replay that fails again commits nothing and returns the error; the
// letter stays as it was. A record that was dead-lettered for having no message id is
// replayed only when the pipeline's MessageID now finds one in it; that id is then claimed
// like a consumed record's, so a record already applied under it is not applied again.
func (c *Consumer) Replay(ctx context.Context, letterID int64) error {
	return c.dead.Replay(ctx, c.pool, letterID, func(ctx context.Context, tx pgx.Tx, l *deadletter.Letter) error {
		if l.Pipeline != c.cfg.Name || l.Scope != c.cfg.Name {
			return fmt.Errorf("dead letter %d (pipeline %q, scope %q): %w", letterID, l.Pipeline, l.Scope, ErrUnknownPipeline)
		}
		r := replayRecord(c.cfg.Name, l)
		if l.MessageID != "" {
			r.msg.ID = l.MessageID
		} else if err := c.claimFound(ctx, tx, r); err != nil {
			return fmt.Errorf("dead letter %d: %w", letterID, err)
		}
		if err := c.apply(ctx, tx, r, nil); err != nil {
			return fmt.Errorf("error replaying dead letter %d: %w", letterID, err)
		}
		log := c.log.WithField("dead_letter", letterID).WithField("message_id", r.msg.ID)
		if r.stale {
			log.Info("dead letter replayed: stale message, effect skipped")
		} else {
			log.Info("dead letter replayed")
		}
		return nil
	})
}

// claimFound gives a record dead-lettered without a message id the id the pipeline finds in
// it now, and claims that id in tx, as a consumed record's claim would.
func (c *Consumer) claimFound(ctx context.Context, tx pgx.Tx, r *record) error {
	id, ok := r.id(c.cfg.MessageID)
	if !ok {
		return fmt.Errorf("the pipeline still finds no message id in the record: %w", ErrNoMessageID)
	}
	if !processed.ValidID(id) {
		return fmt.Errorf("the record's message id cannot be claimed: %w", ErrMalformedMessageID)
	}
	res, err := c.unit.Processed().ClaimBatchTx(ctx, tx, []processed.Claim{{
		Scope: c.cfg.Name, MessageID: id, Fingerprint: fingerprint.Body(r.msg.Value), Payload: r.msg.Value, Retention: c.cfg.Retention,
	}})
	if err != nil {
		return err
	}
	if err := res[0].Err(); err != nil {
		return fmt.Errorf("message id %q: %w", id, err)
	}
	r.msg.ID = id
	return nil
}

// replayRecord rebuilds a dead-lettered record from the letter the consumer wrote
// (deadLetter): value, headers (the first of repeated ones wins, as when consumed), key,
// topic, partition, offset and timestamp. ReceivedAt is when the letter was written.
func replayRecord(pipeline string, l *deadletter.Letter) *record {
	m := kafka.Message{Value: l.Payload, Topic: metaString(l.Metadata, "topic")}
	m.Partition = int(metaInt(l.Metadata, "partition"))
	m.Offset = metaInt(l.Metadata, "offset")
	if k, ok := l.Metadata["key"].(string); ok {
		m.Key = []byte(k)
	}
	if ts, err := time.Parse(time.RFC3339Nano, metaString(l.Metadata, "timestamp")); err == nil {
		m.Time = ts
	}
	for name, values := range l.Headers {
		for _, v := range values {
			m.Headers = append(m.Headers, kafka.Header{Key: name, Value: []byte(v)})
		}
	}
	return newRecord(pipeline, m, l.CreatedAt)
}

func metaString(meta map[string]any, k string) string {
	s, _ := meta[k].(string)
	return s
}

// metaInt reads a number of the letter's metadata (JSON: float64 once decoded).
func metaInt(meta map[string]any, k string) int64 {
	switch v := meta[k].(type) {
	case float64:
		return int64(v)
	case json.Number:
		n, _ := v.Int64()
		return n
	case string:
		n, _ := strconv.ParseInt(v, 10, 64)
		return n
	case int64:
		return v
	case int:
		return int64(v)
	}
	return 0
}

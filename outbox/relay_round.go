package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/google/uuid"
	"github.com/segmentio/kafka-go"

	"github.com/idemd/idemd/internal/metrics"
)

// relayRoundBytes bounds the estimated size of one round's records. Kafka refuses a record
// batch above the broker's message.max.bytes (1048588 by default) for good, so a round of
// BatchSize large rows bound for one partition would fail on every retry and stall the
// outbox; and a round the writer had to split into several batches per partition could land
// a later batch while an earlier one failed, reordering a key. One round below this bound
// makes one batch per partition that the default broker accepts.
const relayRoundBytes = 1_000_000

// recordSize over-estimates the encoded size of m in a record batch.
func recordSize(m *kafka.Message) int {
	n := 32 + len(m.Key) + len(m.Value)
	for _, h := range m.Headers {
		n += 16 + len(h.Key) + len(h.Value)
	}
	return n
}

// round is what one publishing round did (and the value of the Round test signal).
type round struct {
	// Published rows were acknowledged by Kafka and marked.
	Published int
	// DeadLettered rows were moved to dead_letters: too large for the broker, or their
	// topic kept failing for longer than MaxFailingFor.
	DeadLettered int
	// Failed are the topics whose publish failed in this round; their rows wait for a retry.
	Failed []string
	// Held are the topics left out of this round because they wait for a retry.
	Held []string
	// More reports that rows may be left beyond the round's bounds (BatchSize, bytes).
	More bool
}

// clean reports whether the round published everything that was unpublished when it
// started: no row was left beyond its bounds or behind a failing topic.
func (rd *round) clean() bool { return !rd.More && len(rd.Failed) == 0 && len(rd.Held) == 0 }

// topicBatch is the rows of one topic in a round, in id order, and how writing them went.
type topicBatch struct {
	topic string
	ids   []int64
	msgs  []kafka.Message
	err   error
}

// publishRound publishes up to BatchSize unpublished rows in id order, within
// relayRoundBytes, leaving out the topics that wait for a retry. Each topic is written
// separately (concurrently), so that one failing topic holds back only its own rows.
func (r *Relay) publishRound(ctx context.Context) (*round, error) {
	rd := &round{Held: r.heldTopics()}
	batches, more, err := r.selectRound(ctx, rd.Held)
	if err != nil {
		return rd, err
	}
	rd.More = more
	if len(batches) == 0 {
		r.forgetIdleFailures(batches, rd)
		return rd, nil
	}

	var wg sync.WaitGroup
	for _, b := range batches {
		wg.Go(func() { b.err = r.write(ctx, b.topic, b.msgs) })
	}
	wg.Wait()

	var (
		published []int64
		perTopic  = map[string]int{}
	)
	take := func(topic string, ids []int64) {
		published = append(published, ids...)
		perTopic[topic] += len(ids)
	}
	for _, b := range batches {
		switch {
		case b.err == nil:
			take(b.topic, b.ids)
			r.topicRecovered(b.topic)
		case ctx.Err() != nil:
			// Cut short by shutdown: what reached Kafka is marked below; the rest is
			// published by the next round or the next leader.
			take(b.topic, written(b))
		case tooLarge(b.err):
			// Kafka will never take some record of this topic's rows: find it by publishing
			// them one at a time, in order.
			if err := r.publishOneByOne(ctx, b, rd); err != nil {
				return rd, err
			}
		default:
			// Records of partitions that took theirs are published; the topic's other rows
			// wait, in order, behind its retry.
			take(b.topic, written(b))
			ids, msgs := unwritten(b)
			if err := r.topicFailed(ctx, b.topic, ids, msgs, b.err, rd); err != nil {
				return rd, err
			}
		}
	}
	r.forgetIdleFailures(batches, rd)
	if len(published) == 0 {
		return rd, nil
	}
	if r.cfg.AfterPublish != nil {
		if err := r.cfg.AfterPublish(published); err != nil {
			return rd, hookError{err}
		}
	}
	if err := r.mark(ctx, published); err != nil {
		return rd, err
	}
	rd.Published += len(published)
	for topic, n := range perTopic {
		metrics.OutboxPublished.WithLabelValues(topic).Add(float64(n))
	}
	r.log.WithField("count", len(published)).Debug("published outbox rows")
	return rd, nil
}

// selectRound reads the round's rows, grouped by topic in the order their first row comes.
// more reports that rows may be left beyond the round's bounds.
func (r *Relay) selectRound(ctx context.Context, held []string) (batches []*topicBatch, more bool, err error) {
	if held == nil {
		held = []string{}
	}
	rows, done, err := queryNoBitmap(ctx, r.pool, r.selectSQL, r.cfg.BatchSize, held)
	if err != nil {
		return nil, false, fmt.Errorf("error reading outbox: %w", err)
	}
	defer done() //nolint:errcheck // the rows' own error is checked below
	defer rows.Close()
	var (
		byTopic = map[string]*topicBatch{}
		n       int
		bytes   int
	)
	for rows.Next() {
		var (
			id                         int64
			op                         uuid.UUID
			pipeline, causation, topic string
			key, payload               []byte
			headers                    map[string]string
		)
		if err := rows.Scan(&id, &op, &pipeline, &causation, &topic, &key, &payload, &headers); err != nil {
			return nil, false, fmt.Errorf("error reading outbox: %w", err)
		}
		m := kafka.Message{Topic: topic, Key: key, Value: payload, Headers: recordHeaders(op, causation, pipeline, headers)}
		if bytes += recordSize(&m); bytes > relayRoundBytes && n > 0 {
			// The rest waits for the next round, which starts at once.
			more = true
			break
		}
		b := byTopic[topic]
		if b == nil {
			b = &topicBatch{topic: topic}
			byTopic[topic] = b
			batches = append(batches, b)
		}
		b.ids, b.msgs = append(b.ids, id), append(b.msgs, m)
		n++
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, false, fmt.Errorf("error reading outbox: %w", err)
	}
	return batches, more || n == r.cfg.BatchSize, nil
}

// mark records rows as published. Kafka has them: they are marked even if ctx is ending,
// or they would be sent twice.
func (r *Relay) mark(ctx context.Context, ids []int64) error {
	if _, err := r.pool.Exec(context.WithoutCancel(ctx), r.markSQL, ids); err != nil {
		return fmt.Errorf("error marking %d outbox rows published: %w", len(ids), err)
	}
	r.published.Add(int64(len(ids)))
	return nil
}

// written returns the ids of b's records that reached Kafka although the call failed: the
// writer reports one error per record (kafka.WriteErrors) when some partitions took theirs.
func written(b *topicBatch) []int64 {
	var we kafka.WriteErrors
	if !errors.As(b.err, &we) || len(we) != len(b.ids) {
		return nil
	}
	var ids []int64
	for i, e := range we {
		if e == nil {
			ids = append(ids, b.ids[i])
		}
	}
	return ids
}

// unwritten returns b's rows that did not reach Kafka, in order.
func unwritten(b *topicBatch) ([]int64, []kafka.Message) {
	var we kafka.WriteErrors
	if !errors.As(b.err, &we) || len(we) != len(b.ids) {
		return b.ids, b.msgs
	}
	var (
		ids  []int64
		msgs []kafka.Message
	)
	for i, e := range we {
		if e != nil {
			ids, msgs = append(ids, b.ids[i]), append(msgs, b.msgs[i])
		}
	}
	return ids, msgs
}

// tooLarge reports whether the broker refused a record as larger than it accepts.
func tooLarge(err error) bool {
	var we kafka.WriteErrors
	if errors.As(err, &we) {
		for _, e := range we {
			if e != nil && !errors.Is(e, kafka.MessageSizeTooLarge) {
				return false
			}
		}
		return we.Count() > 0
	}
	return errors.Is(err, kafka.MessageSizeTooLarge)
}

// publishOneByOne publishes a topic's rows whose batch the broker refused as too large one
// record at a time, in id order, marking each as it goes and dead-lettering the ones refused
// alone. Records that reached Kafka with the refused batch are published again, with the
// same operation id. Another error makes the rest of the rows wait behind the topic's retry.
func (r *Relay) publishOneByOne(ctx context.Context, b *topicBatch, rd *round) error {
	for i := range b.msgs {
		err := r.write(ctx, b.topic, b.msgs[i:i+1])
		switch {
		case err != nil && tooLarge(err):
			reason := fmt.Sprintf("the broker refuses the record as too large (%d bytes of value): %v", len(b.msgs[i].Value), err)
			if err := r.deadLetter(ctx, b.ids[i:i+1], b.msgs[i:i+1], reason, 1); err != nil {
				return err
			}
			rd.DeadLettered++
			r.log.WithField("topic", b.topic).WithField("bytes", len(b.msgs[i].Value)).
				Error("outbox row too large for the broker: moved to dead_letters so that the outbox goes on")
			continue
		case err != nil && ctx.Err() != nil:
			return nil
		case err != nil:
			return r.topicFailed(ctx, b.topic, b.ids[i:], b.msgs[i:], err, rd)
		}
		if r.cfg.AfterPublish != nil {
			if err := r.cfg.AfterPublish(b.ids[i : i+1]); err != nil {
				return hookError{err}
			}
		}
		if err := r.mark(ctx, b.ids[i:i+1]); err != nil {
			return err
		}
		rd.Published++
		metrics.OutboxPublished.WithLabelValues(b.topic).Inc()
	}
	r.topicRecovered(b.topic)
	return nil
}

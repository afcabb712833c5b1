package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/sirupsen/logrus"

	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/internal/metrics"
	"github.com/idemd/idemd/internal/retry"
)

// topicFailure is the state of a topic whose last publish failed.
type topicFailure struct {
	// failures counts the consecutive failed attempts; the retry backs off with it.
	failures int
	// since is the first failure of the streak that retrying cannot fix (persistentError);
	// zero while the topic failed only in ways that pass (a broker outage).
	since time.Time
	// retryAt is when the topic's rows are tried again; until then rounds leave them out.
	retryAt time.Time
}

// persistentError reports whether a topic's publish failed in a way that retrying does not
// fix without an operator: the topic does not exist (deleted; never created while the
// brokers do not create topics on demand, which the relay never asks for), its name is
// invalid, or the relay may not write to it. Only these count towards MaxFailingFor; a
// broker outage, a leader election or a timeout never dead-letters anything.
func persistentError(err error) bool {
	var we kafka.WriteErrors
	if errors.As(err, &we) {
		for _, e := range we {
			if e != nil && !persistentError(e) {
				return false
			}
		}
		return we.Count() > 0
	}
	return errors.Is(err, kafka.UnknownTopicOrPartition) || errors.Is(err, kafka.TopicAuthorizationFailed) ||
		errors.Is(err, kafka.InvalidTopic)
}

// heldTopics are the topics waiting for their retry, which this round leaves out.
func (r *Relay) heldTopics() []string {
	now := time.Now()
	var held []string
	for topic, f := range r.failing {
		if f.retryAt.After(now) {
			held = append(held, topic)
		}
	}
	slices.Sort(held)
	return held
}

// nextRetry is the earliest retry of a held topic.
func (r *Relay) nextRetry() (time.Time, bool) {
	var at time.Time
	for _, f := range r.failing {
		if at.IsZero() || f.retryAt.Before(at) {
			at = f.retryAt
		}
	}
	return at, !at.IsZero()
}

// topicFailed records a failed publish of topic's rows ids (in order): the rows wait for the
// topic's retry, and every later row of the topic waits with them, so a key never overtakes
// itself. When the topic has been failing persistently for MaxFailingFor, the rows are
// dead-lettered instead and the topic's next rows are tried at once.
func (r *Relay) topicFailed(ctx context.Context, topic string, ids []int64, msgs []kafka.Message, cause error, rd *round) error {
	now := time.Now()
	f := r.failing[topic]
	if f == nil {
		if r.failing == nil {
			r.failing = map[string]*topicFailure{}
		}
		f = &topicFailure{}
		r.failing[topic] = f
		metrics.OutboxTopicFailing.WithLabelValues(topic).Set(1)
	}
	f.failures++
	metrics.OutboxPublishErrors.WithLabelValues(topic).Inc()
	persistent := persistentError(cause)
	if persistent && f.since.IsZero() {
		f.since = now
	}
	log := r.log.WithError(cause).WithFields(logrus.Fields{"topic": topic, "rows": len(ids), "failures": f.failures})
	if persistent && r.cfg.MaxFailingFor >= 0 && now.Sub(f.since) >= r.cfg.MaxFailingFor {
		reason := fmt.Sprintf("topic %s has refused every publish since %s (longer than the relay's MaxFailingFor, %s): %v",
			topic, f.since.UTC().Format(time.RFC3339), r.cfg.MaxFailingFor, cause)
		if err := r.deadLetter(ctx, ids, msgs, reason, f.failures); err != nil {
			return err
		}
		rd.DeadLettered += len(ids)
		f.retryAt = now
		log.WithField("failing_for", now.Sub(f.since).Round(time.Second).Seconds()).
			Error("topic keeps failing: its rows were moved to dead_letters (idemd dlq replay puts them back once the topic works); other topics are not affected")
		return nil
	}
	wait := retry.Backoff(r.cfg.BackoffMin, r.cfg.BackoffMax, f.failures)
	f.retryAt = now.Add(wait)
	rd.Failed = append(rd.Failed, topic)
	log = log.WithField("retry_in", wait.Seconds())
	if persistent && r.cfg.MaxFailingFor >= 0 {
		log = log.WithField("dead_letter_in", (r.cfg.MaxFailingFor - now.Sub(f.since)).Round(time.Second).Seconds())
	}
	log.Warn("error publishing to a topic; its rows are kept and retried, other topics go on")
	return nil
}

// topicRecovered clears a topic's failure after a publish succeeded.
func (r *Relay) topicRecovered(topic string) {
	if _, ok := r.failing[topic]; !ok {
		return
	}
	delete(r.failing, topic)
	metrics.OutboxTopicFailing.WithLabelValues(topic).Set(0)
	r.log.WithField("topic", topic).Info("topic publishes again")
}

// forgetIdleFailures clears failing topics that have no row left: a round that was not
// cut by its bounds saw every unpublished row of every topic it did not hold.
func (r *Relay) forgetIdleFailures(batches []*topicBatch, rd *round) {
	if rd.More {
		return
	}
	for topic := range r.failing {
		if slices.Contains(rd.Held, topic) || slices.ContainsFunc(batches, func(b *topicBatch) bool { return b.topic == topic }) {
			continue
		}
		delete(r.failing, topic)
		metrics.OutboxTopicFailing.WithLabelValues(topic).Set(0)
	}
}

// clearFailing forgets every failure when the relay steps down: the next leader, here or
// elsewhere, starts afresh.
func (r *Relay) clearFailing() {
	for topic := range r.failing {
		metrics.OutboxTopicFailing.WithLabelValues(topic).Set(0)
	}
	r.failing = nil
}

// deadLetter moves outbox rows Kafka will not take (ids, in order, with their records) into
// dead_letters, in one transaction, so that the rows after them are published. Each letter
// keeps the payload and headers; `idemd dlq list` shows it with reason, and `idemd dlq
// replay` puts the event back in the outbox with the same operation id and key.
func (r *Relay) deadLetter(ctx context.Context, ids []int64, msgs []kafka.Message, reason string, attempts int) error {
	ctx = context.WithoutCancel(ctx)
	pipelines := map[string]int{}
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		for i, m := range msgs {
			l := relayLetter(ids[i], m, reason, attempts)
			if _, err := r.letters.WriteTx(ctx, tx, l); err != nil {
				return err
			}
			pipelines[l.Pipeline]++
		}
		_, err := tx.Exec(ctx, r.deleteSQL, ids)
		return err
	})
	if err != nil {
		return fmt.Errorf("error dead-lettering %d outbox rows: %w", len(ids), err)
	}
	for p, n := range pipelines {
		metrics.DeadLettered.WithLabelValues(p).Add(float64(n))
	}
	return nil
}

// relayLetter is the dead letter of outbox row id, whose record is m.
func relayLetter(id int64, m kafka.Message, reason string, attempts int) *deadletter.Letter {
	headers := make(map[string][]string, len(m.Headers))
	var causation, pipeline, op string
	for _, h := range m.Headers {
		headers[h.Key] = append(headers[h.Key], string(h.Value))
		switch h.Key {
		case HeaderCausationID:
			causation = string(h.Value)
		case HeaderPipeline:
			pipeline = string(h.Value)
		case HeaderOperationID:
			op = string(h.Value)
		}
	}
	opID, _ := uuid.Parse(op)
	return &deadletter.Letter{
		Pipeline: pipeline, Origin: deadletter.Origin{Door: deadletter.DoorRelay, OutboxID: id, OperationID: opID},
		Scope: "kafka:" + m.Topic, MessageID: causation, Payload: m.Value, Headers: headers,
		Metadata: map[string]any{"door": "relay", "topic": m.Topic, "key": string(m.Key), "operation_id": op, "outbox_id": id},
		Reason:   reason,
		Attempts: attempts,
	}
}

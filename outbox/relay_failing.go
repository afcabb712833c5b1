package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

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

// persistentError reports whether a destination's publish failed in a way that retrying
// does not fix without an operator: the topic or queue does not exist (deleted; never
// created while the brokers do not create topics on demand, which the relay never asks
// for), its name is invalid, or the relay may not write to it. Only these count towards
// MaxFailingFor; a broker outage, a leader election or a timeout never dead-letters
// anything.
func persistentError(err error) bool {
	return errors.Is(err, kafka.UnknownTopicOrPartition) || errors.Is(err, kafka.TopicAuthorizationFailed) ||
		errors.Is(err, kafka.InvalidTopic) || errors.Is(err, ErrNoDestination) || denied(err)
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

// topicFailed records a failed publish of b's rows (in order, every unpublished row of the
// destination in the round), for cause; persistent says whether every failure was one that
// retrying does not fix (persistentError). The rows wait for the destination's retry, and
// every later row of the destination waits with them, so a key never overtakes itself.
// When the destination has been failing persistently for MaxFailingFor, the rows are
// dead-lettered instead and its next rows are tried at once.
func (r *Relay) topicFailed(ctx context.Context, b *batch, cause error, persistent bool, rd *round) error {
	now := time.Now()
	topic := b.dest
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
	if persistent && f.since.IsZero() {
		f.since = now
	}
	log := r.log.WithError(cause).WithFields(logrus.Fields{"topic": topic, "rows": len(b.ids), "failures": f.failures})
	if persistent && r.cfg.MaxFailingFor >= 0 && now.Sub(f.since) >= r.cfg.MaxFailingFor {
		reason := fmt.Sprintf("%s %s has refused every publish since %s (longer than the relay's MaxFailingFor, %s): %v",
			destinationNoun(b.kind), b.name, f.since.UTC().Format(time.RFC3339), r.cfg.MaxFailingFor, cause)
		reasons := make([]string, len(b.ids))
		for i := range reasons {
			reasons[i] = reason
		}
		if err := r.deadLetter(ctx, b, reasons, f.failures); err != nil {
			return err
		}
		rd.DeadLettered += len(b.ids)
		f.retryAt = now
		log.WithField("failing_for", now.Sub(f.since).Round(time.Second).Seconds()).
			Error("destination keeps failing: its rows were moved to dead_letters (idemd dlq replay puts them back once it works); other destinations are not affected")
		return nil
	}
	wait := retry.Backoff(r.cfg.BackoffMin, r.cfg.BackoffMax, f.failures)
	f.retryAt = now.Add(wait)
	rd.Failed = append(rd.Failed, topic)
	log = log.WithField("retry_in", wait.Seconds())
	if persistent && r.cfg.MaxFailingFor >= 0 {
		log = log.WithField("dead_letter_in", (r.cfg.MaxFailingFor - now.Sub(f.since)).Round(time.Second).Seconds())
	}
	log.Warn("error publishing to a topic or queue; its rows are kept and retried, other destinations go on")
	return nil
}

// destinationNoun names a kind of destination for people: "Kafka topic", "Pub/Sub topic",
// "SQS queue".
func destinationNoun(kind string) string {
	if kind == DestinationSQS {
		return "SQS queue"
	}
	return brokerName(kind) + " topic"
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

// forgetIdleFailures clears failing destinations that have no row left: a round that was
// not cut by its bounds saw every unpublished row of every destination it did not hold.
func (r *Relay) forgetIdleFailures(batches []*batch, rd *round) {
	if rd.More {
		return
	}
	for topic := range r.failing {
		if slices.Contains(rd.Held, topic) || slices.ContainsFunc(batches, func(b *batch) bool { return b.dest == topic }) {
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

// deadLetter moves outbox rows their broker will not take (b's rows, in order, reasons[i]
// being row i's) into dead_letters, in one transaction, so that the rows after them are
// published. Each letter keeps the payload, headers, key, destination and operation id;
// `idemd dlq list` shows it with its reason, and `idemd dlq replay` puts the event back in
// the outbox, to the same destination with the same operation id and key.
func (r *Relay) deadLetter(ctx context.Context, b *batch, reasons []string, attempts int) error {
	ctx = context.WithoutCancel(ctx)
	pipelines := map[string]int{}
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		for i := range b.events {
			l := relayLetter(b.ids[i], b.dest, &b.events[i], reasons[i], attempts)
			if _, err := r.letters.WriteTx(ctx, tx, l); err != nil {
				return err
			}
			pipelines[l.Pipeline]++
		}
		_, err := tx.Exec(ctx, r.deleteSQL, b.ids)
		return err
	})
	if err != nil {
		return fmt.Errorf("error dead-lettering %d outbox rows: %w", len(b.ids), err)
	}
	for p, n := range pipelines {
		metrics.DeadLettered.WithLabelValues(p).Add(float64(n))
	}
	return nil
}

// relayLetter is the dead letter of outbox row id, bound for dest (its topic column), whose
// event is e (Topic the broker's name). Its headers are those the broker would have
// received; its scope is the kind and name of the destination ("kafka:orders",
// "pubsub:orders", "sqs:payments.fifo"); metadata's topic is dest, which a replay writes
// back.
func relayLetter(id int64, dest string, e *Event, reason string, attempts int) *deadletter.Letter {
	headers := make(map[string][]string, len(e.Headers)+3)
	for k, v := range attributes(e) {
		headers[k] = []string{v}
	}
	kind, name := ParseDestination(dest)
	op := opID(e)
	return &deadletter.Letter{
		Pipeline: e.Pipeline, Origin: deadletter.Origin{Door: deadletter.DoorRelay, OutboxID: id, OperationID: e.OperationID},
		Scope: kind + ":" + name, MessageID: e.CausationID, Payload: e.Payload, Headers: headers,
		Metadata: map[string]any{"door": "relay", "topic": dest, "key": string(e.Key), "operation_id": op, "outbox_id": id},
		Reason:   reason,
		Attempts: attempts,
	}
}

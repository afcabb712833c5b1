// Package metrics holds idemd's Prometheus series, on a registry of its own that the admin
// server exposes at /metrics. Every door and the relay report here; names and labels are part
// of idemd's operations contract (README, alert rules, dashboard) and change only with them.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Registry is where every idemd series is registered.
var Registry = prometheus.NewRegistry()

var (
	// Received counts inbound messages per pipeline and door ("http", "kafka", "pubsub" or
	// "sqs"), before dedup.
	Received = counter("idemd_messages_received_total", "Inbound messages received, before dedup.", "pipeline", "door")
	// Processed counts messages whose effect committed: when they arrived, or when their
	// dead letter was replayed.
	Processed = counter("idemd_messages_processed_total", "Messages whose effect committed (exactly once).", "pipeline")
	// Duplicates counts redeliveries answered from the processed record.
	Duplicates = counter("idemd_messages_duplicate_total", "Redeliveries recognised as duplicates; effect not repeated.", "pipeline")
	// Conflicts counts ids seen again with a different payload.
	Conflicts = counter("idemd_messages_conflict_total", "Ids seen again with a different payload fingerprint; effect not run.", "pipeline")
	// DeadLettered counts messages dead-lettered after permanent failures.
	DeadLettered = counter("idemd_messages_dead_lettered_total", "Messages dead-lettered after permanent failures.", "pipeline")
	// Stale counts messages acknowledged without effect by the stale-event guard, and dead
	// letters whose replay it skipped.
	Stale = counter("idemd_messages_stale_total", "Messages skipped by the stale-event guard (version not newer).", "pipeline")
	// DeadLettersReplayed counts dead letters replayed (deadletter.Replayer), per pipeline,
	// door that wrote the letter, and what the replay did: "applied" (the effect committed;
	// also counted in Processed), "stale" (skipped by the stale-event guard; also counted in
	// Stale) or "requeued" (an outbound event put back in the outbox or made pending again).
	// Only committed replays count: a replay that fails, or is refused as already replayed,
	// counts nothing.
	DeadLettersReplayed = counter("idemd_dead_letters_replayed_total", "Dead letters replayed, counted at the replay's commit, by the door that wrote them and what the replay did (applied, stale, requeued).", "pipeline", "door", "outcome")
	// InFlight counts requests answered 409 because the same key was in flight.
	InFlight = counter("idemd_messages_in_flight_total", "Requests answered while the same key was in flight.", "pipeline")
	// Rejected counts HTTP requests rejected before dedup, by reason (signature, bad_request, too_large…).
	Rejected = counter("idemd_http_rejected_total", "HTTP requests rejected before dedup, by reason.", "pipeline", "reason")
	// Retries counts transient failures that made a batch retry.
	Retries = counter("idemd_transaction_retries_total", "Transient failures that rolled a batch back for a retry.", "door")

	// TxDuration is the latency of exactly-once transactions (claim, effects, commit).
	TxDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "idemd_transaction_duration_seconds", Help: "Duration of exactly-once transactions, claim to commit.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
	}, []string{"door"})
	// TxBatchSize is how many messages each exactly-once transaction carried.
	TxBatchSize = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "idemd_transaction_batch_size", Help: "Messages per exactly-once transaction.",
		Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024},
	}, []string{"door"})
	// RequestDuration is the latency of HTTP requests to sources.
	RequestDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "idemd_http_request_duration_seconds", Help: "Duration of HTTP requests to sources, by status code.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
	}, []string{"pipeline", "code"})

	// OutboxBacklog is the number of unpublished outbox rows. Only the relay leader exports
	// it (WithLabelValues()): the relay deletes it (Reset) when it loses the leadership, so
	// that max() over replicas is the leader's value after a failover, never a former
	// leader's last one.
	OutboxBacklog = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "idemd_outbox_backlog", Help: "Unpublished outbox rows (exported by the relay leader only).",
	}, nil)
	// OutboxOldestAge is the age of the oldest unpublished outbox row; like OutboxBacklog,
	// the relay leader's alone.
	OutboxOldestAge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "idemd_outbox_oldest_unpublished_age_seconds", Help: "Age of the oldest unpublished outbox row, 0 when none (exported by the relay leader only).",
	}, nil)
	// OutboxPublished counts records the relay published, per topic.
	OutboxPublished = counter("idemd_outbox_published_total", "Outbox rows published to Kafka.", "topic")
	// OutboxPublishErrors counts failed attempts to publish a topic's rows, per topic.
	OutboxPublishErrors = counter("idemd_outbox_publish_errors_total", "Failed attempts to publish outbox rows, per topic.", "topic")
	// OutboxTopicFailing is 1 for each topic whose last publish failed: its rows wait for a
	// retry (and are dead-lettered if it keeps failing persistently); other topics go on.
	OutboxTopicFailing = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "idemd_outbox_topic_failing", Help: "1 while the relay's last publish to the topic failed; its rows wait for a retry.",
	}, []string{"topic"})
	// RelayLeader is 1 in the process that holds the relay leadership.
	RelayLeader = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "idemd_relay_leader", Help: "1 when this process is the active outbox relay.",
	})
	// RelayExpected is 1 in a daemon whose pipelines publish to Kafka, Pub/Sub or SQS (a
	// publish target or a dead-letter topic): their outbox rows wait until some process
	// leads the relay. With HTTP targets only, the relay has nothing to publish (and is not
	// started without brokers), so no leader is needed: the IdemdNoRelayLeader alert keys
	// on this gauge to tell the two apart.
	RelayExpected = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "idemd_relay_expected", Help: "1 when this process's pipelines publish to Kafka, Pub/Sub or SQS, so that some process must lead the outbox relay.",
	})
	// ConsumerLag is the lag of each partition of a subscription's consumer group, in
	// records: the broker's high-water mark minus the group's committed offset, as
	// consumer.LagMonitor reads them from the broker. Every replica running the consumer
	// role reports the whole group, so aggregate with max by (pipeline, topic, partition).
	ConsumerLag = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "idemd_consumer_lag", Help: "Records between the consumer group's committed offset and the partition's high-water mark, read from the broker.",
	}, []string{"pipeline", "topic", "partition"})
	// ConsumerLagErrors counts failed reads of the consumer lag from the broker; the last
	// values read stay exported meanwhile.
	ConsumerLagErrors = counter("idemd_consumer_lag_errors_total", "Failed reads of the consumer group's offsets or the partitions' high-water marks.", "pipeline")
	// SubscriptionBacklog is the messages of a subscription's queue not yet acknowledged,
	// where the broker reports it to its client: SQS's ApproximateNumberOfMessages plus
	// ApproximateNumberOfMessagesNotVisible (consumer.Consumer.Backlog). Every replica
	// running the subscription reports the same queue: aggregate with max by (pipeline).
	SubscriptionBacklog = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "idemd_subscription_backlog", Help: "Messages of the subscription's queue not yet acknowledged (visible and in flight), as the broker approximates them (SQS).",
	}, []string{"pipeline"})
	// Pruned counts rows the pruner deleted, per table.
	Pruned = counter("idemd_pruned_rows_total", "Rows deleted by the pruner.", "table")
	// ProcessedEpochs is how many epochs (partitions) processed_messages has, as the
	// pruner last read them.
	ProcessedEpochs = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "idemd_processed_epochs", Help: "Epochs (partitions) of processed_messages, read by the pruner every round; with IDEMD_PROCESSED_PARTITION_INTERVAL, about the longest retention / the interval + 2.",
	})
	// ProcessedFilterIDs is how many ids the filter of processed_messages' older epochs
	// holds (processed.EpochFilter).
	ProcessedFilterIDs = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "idemd_processed_filter_ids", Help: "Ids of processed_messages' older epochs in this process's filter, which spares a new id their lookup; 0 with one epoch, with no filter (IDEMD_PROCESSED_FILTER_MAX_BYTES=0) or when they do not fit in it.",
	})
)

// Pipeline creates at 0 the message series of pipeline, whose messages arrive through door
// ("http", "kafka", "pubsub" or "sqs"): a series born at its first increment hides that
// increment from rate() and increase(), so that an alert such as IdemdDeadLetters would miss
// a pipeline's first dead letter after each start. The doors call it when they are built.
func Pipeline(pipeline, door string) {
	Received.WithLabelValues(pipeline, door)
	for _, c := range []*prometheus.CounterVec{Processed, Duplicates, Conflicts, DeadLettered, Stale} {
		c.WithLabelValues(pipeline)
	}
	if door == "http" {
		InFlight.WithLabelValues(pipeline)
	}
}

func counter(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}

func init() {
	Registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		Received, Processed, Duplicates, Conflicts, DeadLettered, DeadLettersReplayed, Stale, InFlight, Rejected, Retries,
		TxDuration, TxBatchSize, RequestDuration,
		OutboxBacklog, OutboxOldestAge, OutboxPublished, OutboxPublishErrors, OutboxTopicFailing, RelayLeader, RelayExpected,
		ConsumerLag, ConsumerLagErrors, SubscriptionBacklog, Pruned, ProcessedEpochs, ProcessedFilterIDs,
		poolStats, kafkaReaders, kafkaWriters,
	)
}

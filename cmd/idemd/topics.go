package main

import (
	"context"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemd/idemd/internal/kafkatopic"
)

// topicPartitionsDefault is the partition count of topics createTopics makes.
const topicPartitionsDefault = 3

// createTopics creates the topics that do not exist yet, with topicPartitionsDefault
// partitions and replication factor 1 (development brokers and tests), and returns once
// their metadata is visible (internal/kafkatopic says why that may take a few looks).
func createTopics(ctx context.Context, brokers []string, topics []string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	configs := make([]kafka.TopicConfig, len(topics))
	for i, t := range topics {
		configs[i] = kafka.TopicConfig{Topic: t, NumPartitions: topicPartitionsDefault, ReplicationFactor: 1}
	}
	return kafkatopic.Create(ctx, &kafka.Client{Addr: kafka.TCP(brokers...)}, configs...)
}

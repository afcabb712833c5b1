package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
)

// topicPartitionsDefault is the partition count of topics createTopics makes.
const topicPartitionsDefault = 3

// createTopics creates the topics that do not exist yet, with topicPartitionsDefault
// partitions and replication factor 1 (development brokers and tests), and waits until
// their metadata is visible.
func createTopics(ctx context.Context, brokers []string, topics []string) error {
	if len(topics) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cl := &kafka.Client{Addr: kafka.TCP(brokers...)}
	req := &kafka.CreateTopicsRequest{}
	for _, t := range topics {
		req.Topics = append(req.Topics, kafka.TopicConfig{Topic: t, NumPartitions: topicPartitionsDefault, ReplicationFactor: 1})
	}
	resp, err := cl.CreateTopics(ctx, req)
	if err != nil {
		return fmt.Errorf("error creating topics: %w", err)
	}
	for t, err := range resp.Errors {
		if err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
			return fmt.Errorf("error creating topic %s: %w", t, err)
		}
	}
	for {
		md, err := cl.Metadata(ctx, &kafka.MetadataRequest{Topics: topics})
		if err == nil && len(md.Topics) == len(topics) {
			ok := true
			for _, t := range md.Topics {
				ok = ok && t.Error == nil && len(t.Partitions) > 0
			}
			if ok {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("topics did not appear: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

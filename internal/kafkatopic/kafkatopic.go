// Package kafkatopic creates Kafka topics for `idemd dev`, IDEMD_KAFKA_CREATE_TOPICS and the
// tests. Guarantee: Create returns nil only once every topic exists and the cluster's
// metadata shows its partitions, so a producer or consumer started next finds it.
package kafkatopic

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemd/idemd/internal/retry"
)

// RefusedError is the broker's refusal to create a topic (an invalid name, a policy, an
// authorization): trying again does not help.
type RefusedError struct {
	Topic string
	Err   error
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("error creating topic %s: %v", e.Topic, e.Err)
}

func (e *RefusedError) Unwrap() error { return e.Err }

// Create creates the topics of configs that do not exist yet (a topic that exists already
// is kept as it is) and waits until the metadata shows every one of them. A topic the
// broker refused is a *RefusedError; any other error is the request's (connection, timeout,
// a broker that is not ready yet).
func Create(ctx context.Context, cl *kafka.Client, configs ...kafka.TopicConfig) error {
	if len(configs) == 0 {
		return nil
	}
	// kafka-go sends CreateTopics with timeout_ms from ctx's deadline (else the client's
	// timeout, else 2 s): the controller answers once it has created the topics, not at once.
	resp, err := cl.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: configs})
	if err != nil {
		return fmt.Errorf("error creating topics: %w", err)
	}
	created := map[string]bool{}
	for _, c := range configs {
		err := resp.Errors[c.Topic]
		switch {
		case err == nil:
			created[c.Topic] = true
		case !errors.Is(err, kafka.TopicAlreadyExists):
			return &RefusedError{Topic: c.Topic, Err: err}
		}
	}
	return waitVisible(ctx, cl, configs, created)
}

// waitVisible returns once the metadata shows every topic of configs, with all its
// partitions for the ones just created.
//
// The controller answered CreateTopics after creating the topics, but the other brokers
// learn of them asynchronously (from the metadata log under KRaft, from ZooKeeper before),
// and the protocol has no request that waits for that. So Create looks, and when a broker
// does not know a topic yet looks again after a short backoff (10 ms doubling to 500 ms,
// jittered), until ctx ends. On a one-broker cluster (kfake, `idemd dev`) the first look
// finds them.
func waitVisible(ctx context.Context, cl *kafka.Client, configs []kafka.TopicConfig, created map[string]bool) error {
	names := make([]string, len(configs))
	want := map[string]int{}
	for i, c := range configs {
		names[i] = c.Topic
		if created[c.Topic] && c.NumPartitions > 0 {
			want[c.Topic] = c.NumPartitions
		}
	}
	for attempt := 1; ; attempt++ {
		md, err := cl.Metadata(ctx, &kafka.MetadataRequest{Topics: names})
		if err == nil && visible(md, names, want) {
			return nil
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = ctx.Err()
			}
			return fmt.Errorf("topics %v did not appear in the metadata: %w", names, err)
		case <-time.After(retry.Backoff(10*time.Millisecond, 500*time.Millisecond, attempt)):
		}
	}
}

func visible(md *kafka.MetadataResponse, names []string, partitions map[string]int) bool {
	seen := map[string]bool{}
	for _, t := range md.Topics {
		if t.Error != nil || len(t.Partitions) == 0 {
			return false
		}
		if n, ok := partitions[t.Name]; ok && len(t.Partitions) != n {
			return false
		}
		seen[t.Name] = true
	}
	for _, n := range names {
		if !seen[n] {
			return false
		}
	}
	return true
}

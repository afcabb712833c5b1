// Package kafkatest gives tests a real Kafka-protocol broker and unique topics and groups on
// it. The broker is, in order of preference: TEST_KAFKA_BROKERS (a comma list), a Kafka
// container started through testcontainers when a Docker engine answers, or the in-process
// kfake broker from franz-go. One broker serves the whole test binary.
package kafkatest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/testcontainers/testcontainers-go"
	tckafka "github.com/testcontainers/testcontainers-go/modules/kafka"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idemd/idemd/internal/kafkatopic"
	"github.com/idemd/idemd/internal/retry"
)

// KafkaImage is the image started through testcontainers when a Docker engine answers.
const KafkaImage = "confluentinc/confluent-local:7.6.1"

var (
	once    sync.Once
	brokers []string
	kind    string
	initErr error
)

// Brokers returns the addresses of the shared test broker, starting it on first use.
func Brokers(tb testing.TB) []string {
	tb.Helper()
	once.Do(start)
	if initErr != nil {
		tb.Fatalf("kafkatest: no broker: %v", initErr)
	}
	return brokers
}

// Kind says which broker Brokers returned: "env", "testcontainers" or "kfake".
func Kind(tb testing.TB) string {
	Brokers(tb)
	return kind
}

func start() {
	if env := os.Getenv("TEST_KAFKA_BROKERS"); env != "" {
		brokers, kind = strings.Split(env, ","), "env"
		return
	}
	if dockerAnswers() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		c, err := tckafka.Run(ctx, KafkaImage, tckafka.WithClusterID("idemd-test"))
		if err == nil {
			brokers, err = c.Brokers(ctx)
		}
		if err == nil {
			kind = "testcontainers"
			return
		}
		fmt.Fprintf(os.Stderr, "kafkatest: testcontainers failed (%v); using the in-process kfake broker\n", err)
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		initErr = fmt.Errorf("starting kfake: %w", err)
		return
	}
	// The cluster lives as long as the test binary: it is in memory only.
	brokers, kind = c.ListenAddrs(), "kfake"
}

func dockerAnswers() bool {
	if os.Getenv("DOCKER_HOST") == "" {
		if _, err := os.Stat("/var/run/docker.sock"); err != nil {
			return false
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	p, err := testcontainers.NewDockerProvider()
	if err != nil {
		return false
	}
	defer p.Close()
	return p.Health(ctx) == nil
}

var unsafeName = regexp.MustCompile(`[^a-zA-Z0-9._-]+`)

// Name returns a name unique to this test and this run, usable as a topic or a group.
func Name(tb testing.TB, prefix string) string {
	tb.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := unsafeName.ReplaceAllString(tb.Name(), "_")
	if len(name) > 80 {
		name = name[len(name)-80:]
	}
	return prefix + "." + name + "." + hex.EncodeToString(b[:])
}

// Topic creates a topic unique to this test with the given number of partitions.
func Topic(tb testing.TB, partitions int) string {
	tb.Helper()
	topic := Name(tb, "t")
	CreateTopic(tb, topic, partitions)
	return topic
}

// CreateTopic creates the named topic on the shared broker; it is visible with its
// partitions when CreateTopic returns.
func CreateTopic(tb testing.TB, topic string, partitions int) {
	tb.Helper()
	CreateTopicOn(tb, Brokers(tb), topic, partitions)
}

// CreateTopicOn is CreateTopic on the cluster at brokers (a test's own broker). A request
// that fails on the way (after a broker came back, pooled connections to the old one fail
// once, or answer that the broker is not available yet) is retried with a growing backoff
// for up to 30 seconds; the broker's refusal of the topic is not.
func CreateTopicOn(tb testing.TB, brokers []string, topic string, partitions int) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	for attempt := 1; ; attempt++ {
		err := kafkatopic.Create(ctx, cl, kafka.TopicConfig{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1})
		var refused *kafkatopic.RefusedError
		switch {
		case err == nil:
			return
		case errors.As(err, &refused), ctx.Err() != nil:
			tb.Fatalf("kafkatest: creating topic %s: %v", topic, err)
		}
		select {
		case <-ctx.Done():
			tb.Fatalf("kafkatest: creating topic %s: %v", topic, err)
		case <-time.After(retry.Backoff(50*time.Millisecond, time.Second, attempt)):
		}
	}
}

// Group returns a consumer group name unique to this test.
func Group(tb testing.TB) string {
	tb.Helper()
	return Name(tb, "g")
}

// ReadAll reads every record of topic on the shared broker from the beginning, without a
// group, until it has read want records or the timeout passes; it returns what it read.
func ReadAll(tb testing.TB, topic string, want int, timeout time.Duration) []kafka.Message {
	tb.Helper()
	return ReadAllFrom(tb, Brokers(tb), topic, want, timeout)
}

// ReadAllFrom is ReadAll on the cluster at brokers (a test's own broker).
func ReadAllFrom(tb testing.TB, brokers []string, topic string, want int, timeout time.Duration) []kafka.Message {
	tb.Helper()
	return readAll(tb, brokers, topic, want, timeout, 0)
}

// ReadAtLeastFrom is ReadAllFrom that does not stop at want: once want records are in, it
// reads each partition on until nothing arrives for quiet, so copies beyond want
// (republished records) are returned too.
func ReadAtLeastFrom(tb testing.TB, brokers []string, topic string, want int, timeout, quiet time.Duration) []kafka.Message {
	tb.Helper()
	return readAll(tb, brokers, topic, want, timeout, quiet)
}

// readAll reads topic until want records are in (then, with quiet > 0, until each partition
// was quiet that long) or timeout passes.
func readAll(tb testing.TB, brokers []string, topic string, want int, timeout, quiet time.Duration) []kafka.Message {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	md, err := cl.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil || len(md.Topics) != 1 {
		tb.Fatalf("kafkatest: metadata of %s: %v", topic, err)
	}
	var (
		mu  sync.Mutex
		out []kafka.Message
		wg  sync.WaitGroup
	)
	for _, p := range md.Topics[0].Partitions {
		wg.Add(1)
		go func(partition int) {
			defer wg.Done()
			// kafka-go's reader gives up on a fetch whose answer has not started within
			// MaxWait, and fetches the same offset again: with 50 ms, a fetch of a few MB
			// from kfake under -race never started in time, and nothing was ever read
			// (TestRelayBacklogOfLargeRows failed 2 to 4 times in 8).
			r := kafka.NewReader(kafka.ReaderConfig{
				Brokers: brokers, Topic: topic, Partition: partition,
				MinBytes: 1, MaxBytes: 10 << 20, MaxWait: 500 * time.Millisecond,
			})
			defer r.Close()
			for {
				mu.Lock()
				done := len(out) >= want
				mu.Unlock()
				if done && quiet <= 0 {
					return
				}
				wait := 200 * time.Millisecond
				if done {
					wait = quiet
				}
				fctx, fcancel := context.WithTimeout(ctx, wait)
				m, err := r.ReadMessage(fctx)
				fcancel()
				if err != nil {
					if done || ctx.Err() != nil {
						return
					}
					continue
				}
				mu.Lock()
				out = append(out, m)
				mu.Unlock()
			}
		}(p.ID)
	}
	wg.Wait()
	return out
}

// Header returns the value of the first header named key, or "".
func Header(m kafka.Message, key string) string {
	for _, h := range m.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

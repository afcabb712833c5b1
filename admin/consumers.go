package admin

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemd/idemd/processed"
)

// Consumer is one inbound subscription as the console shows it.
type Consumer struct {
	Pipeline string `json:"pipeline"`
	// Door is the broker: kafka, pubsub or sqs.
	Door string `json:"door"`
	// Group and Topics are a Kafka subscription's.
	Group  string   `json:"group"`
	Topics []string `json:"topics"`
	// Subscription is the Pub/Sub subscription or the SQS queue.
	Subscription string `json:"subscription,omitempty"`
	// Backlog is the messages of an SQS queue not yet acknowledged (visible and in flight);
	// nil where the broker does not report it to its client (Pub/Sub: Cloud Monitoring's
	// subscription/num_undelivered_messages has it).
	Backlog *int64 `json:"backlog,omitempty"`
	// Partitions are the group's committed and end offsets per partition (Kafka).
	Partitions []Partition `json:"partitions"`
	// Lag is the sum of the partitions' lag; nil when it is unknown (the broker could not
	// be asked: Error says why).
	Lag *int64 `json:"lag,omitempty"`
	// LastBatch is the last transaction that committed messages of this pipeline.
	LastBatch *Batch `json:"last_batch,omitempty"`
	// Error says why the broker could not be asked (the rest is then empty).
	Error string `json:"error,omitempty"`
}

// Partition is one partition of a consumer group.
type Partition struct {
	Topic     string `json:"topic"`
	Partition int    `json:"partition"`
	// Committed is the group's committed offset (-1: none committed yet).
	Committed int64 `json:"committed"`
	// End is the partition's end offset (the next record's offset).
	End int64 `json:"end"`
	Lag int64 `json:"lag"`
}

// Batch is a committed batch of a subscription.
type Batch struct {
	CommittedAt   time.Time `json:"committed_at"`
	Messages      int64     `json:"messages"`
	LastMessageID string    `json:"last_message_id,omitempty"`
}

// KafkaSubscription names what KafkaConsumers reports on.
type KafkaSubscription struct {
	Pipeline string
	Group    string
	Topics   []string
}

// BrokerSubscription names a Pub/Sub or SQS subscription that KafkaConsumers reports on.
type BrokerSubscription struct {
	Pipeline string
	// Door is "pubsub" or "sqs".
	Door string
	// Subscription is the subscription or queue as the pipeline names it.
	Subscription string
	// Backlog, when set, reads the backlog from the broker (consumer.Consumer.Backlog of
	// an SQS subscription). Defaults to nil: no backlog shown.
	Backlog func(ctx context.Context) (int64, error)
}

// KafkaConsumers reports Kafka subscriptions from what the broker and the database know,
// without asking the consumers themselves: the group's committed offsets and the partitions'
// end offsets (hence the lag, whichever replica holds the partitions), and the last batch
// committed to processed_messages. What only a running consumer knows (which partitions this
// replica holds, the offsets of its last batch) needs a status snapshot from the consumer.
type KafkaConsumers struct {
	Pool          *pgxpool.Pool
	Schema        string
	Brokers       []string
	Subscriptions []KafkaSubscription
	// Brokered are the Pub/Sub and SQS subscriptions, reported after the Kafka ones with
	// their backlog (where known) and last committed batch. Defaults to none.
	Brokered []BrokerSubscription
	// Timeout bounds the broker requests. Defaults to 5 s.
	Timeout time.Duration
}

// Consumers implements ConsumerStatus.
func (k *KafkaConsumers) Consumers(ctx context.Context) ([]Consumer, error) {
	store, err := processed.New(&processed.Config{Schema: k.Schema})
	if err != nil {
		return nil, err
	}
	timeout := k.Timeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	client := &kafka.Client{Addr: kafka.TCP(k.Brokers...), Timeout: timeout}
	out := make([]Consumer, 0, len(k.Subscriptions)+len(k.Brokered))
	for _, sub := range k.Subscriptions {
		c := Consumer{Pipeline: sub.Pipeline, Door: "kafka", Group: sub.Group, Topics: sub.Topics, Partitions: []Partition{}}
		if err := kafkaLag(ctx, client, &c); err != nil {
			c.Error = err.Error()
		}
		out = append(out, c)
	}
	for _, sub := range k.Brokered {
		c := Consumer{Pipeline: sub.Pipeline, Door: sub.Door, Subscription: sub.Subscription, Topics: []string{}, Partitions: []Partition{}}
		if sub.Backlog != nil {
			bctx, cancel := context.WithTimeout(ctx, timeout)
			n, err := sub.Backlog(bctx)
			cancel()
			if err != nil {
				c.Error = err.Error()
			} else {
				c.Backlog = &n
			}
		}
		out = append(out, c)
	}
	for i := range out {
		b, err := store.LastBatchOf(ctx, k.Pool, out[i].Pipeline)
		if err != nil {
			return nil, err
		}
		if b != nil {
			out[i].LastBatch = &Batch{CommittedAt: b.CommittedAt, Messages: b.Messages, LastMessageID: b.LastMessageID}
		}
	}
	return out, nil
}

// errNoBrokers: the process has no Kafka brokers to ask.
var errNoBrokers = errors.New("no Kafka brokers are configured in this process (IDEMD_KAFKA_BROKERS is empty): the lag is unknown")

// kafkaLag fills c's partitions and lag from the broker.
func kafkaLag(ctx context.Context, client *kafka.Client, c *Consumer) error {
	if client.Addr == nil || client.Addr.String() == "" {
		return errNoBrokers
	}
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: c.Topics})
	if err != nil {
		return fmt.Errorf("the brokers do not answer: %w", err)
	}
	parts := map[string][]int{}
	ends := map[string][]kafka.OffsetRequest{}
	for _, t := range md.Topics {
		if t.Error != nil {
			return fmt.Errorf("topic %s: %w", t.Name, t.Error)
		}
		for _, p := range t.Partitions {
			parts[t.Name] = append(parts[t.Name], p.ID)
			ends[t.Name] = append(ends[t.Name], kafka.LastOffsetOf(p.ID))
		}
	}
	committed, err := client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: c.Group, Topics: parts})
	if err != nil {
		return fmt.Errorf("group %s: %w", c.Group, err)
	}
	last, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: ends})
	if err != nil {
		return fmt.Errorf("end offsets: %w", err)
	}
	var total int64
	end := map[string]map[int]int64{}
	for topic, ps := range last.Topics {
		end[topic] = map[int]int64{}
		for _, p := range ps {
			end[topic][p.Partition] = p.LastOffset
		}
	}
	for topic, ps := range committed.Topics {
		for _, p := range ps {
			e := end[topic][p.Partition]
			lag := e - max(p.CommittedOffset, 0)
			c.Partitions = append(c.Partitions, Partition{Topic: topic, Partition: p.Partition, Committed: p.CommittedOffset, End: e, Lag: lag})
			total += lag
		}
	}
	c.Lag = &total
	sort.Slice(c.Partitions, func(i, j int) bool {
		a, b := c.Partitions[i], c.Partitions[j]
		return a.Topic < b.Topic || a.Topic == b.Topic && a.Partition < b.Partition
	})
	return nil
}

func (s *Server) consumers(ctx context.Context) ([]Consumer, error) {
	if s.cfg.Consumers == nil {
		return []Consumer{}, nil
	}
	return s.cfg.Consumers.Consumers(ctx)
}

func (s *Server) apiConsumers(w http.ResponseWriter, r *http.Request) {
	if s.noParams(w, r) {
		return
	}
	out, err := s.consumers(r.Context())
	if err != nil {
		s.internal(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, page{Data: out})
}

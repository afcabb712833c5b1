package outbox

import (
	"fmt"
	"regexp"
	"strings"
)

// Destination kinds (ParseDestination).
const (
	// DestinationKafka is a Kafka topic: Event.Topic as it is.
	DestinationKafka = "kafka"
	// DestinationPubSub is a Google Cloud Pub/Sub topic: Event.Topic "pubsub:" + topic.
	DestinationPubSub = "pubsub"
	// DestinationSQS is an Amazon SQS queue: Event.Topic "sqs:" + queue.
	DestinationSQS = "sqs"
)

// An event's destination is encoded in Event.Topic (and the outbox's topic column): a Kafka
// topic as it is, a Pub/Sub topic as "pubsub:" + topic, an SQS queue as "sqs:" + queue.
// Kafka topic names hold only letters, digits, '.', '_' and '-', so a ':' never belongs to
// one and the encoding is unambiguous; rows written before Pub/Sub and SQS existed are
// Kafka's, unchanged.
const (
	pubSubPrefix = DestinationPubSub + ":"
	sqsPrefix    = DestinationSQS + ":"
)

// PubSubDestination is the Event.Topic of events published to Pub/Sub topic: a topic id of
// the client's project, or a full name (projects/P/topics/T).
func PubSubDestination(topic string) string { return pubSubPrefix + topic }

// SQSDestination is the Event.Topic of events published to SQS queue: a queue name,
// resolved with GetQueueUrl, or a queue URL.
func SQSDestination(queue string) string { return sqsPrefix + queue }

// ParseDestination splits an Event.Topic into its kind (DestinationKafka,
// DestinationPubSub, DestinationSQS) and the name the broker knows: the Kafka topic, the
// Pub/Sub topic, the SQS queue.
func ParseDestination(topic string) (kind, name string) {
	if name, ok := strings.CutPrefix(topic, pubSubPrefix); ok {
		return DestinationPubSub, name
	}
	if name, ok := strings.CutPrefix(topic, sqsPrefix); ok {
		return DestinationSQS, name
	}
	return DestinationKafka, topic
}

var (
	kafkaTopic = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)
	// pubSubTopicID: 3 to 255 characters, starting with a letter, of letters, digits and
	// - _ . ~ + % (Pub/Sub's resource names).
	pubSubTopicID = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9._~+%-]{2,254}$`)
	// pubSubProject: a project id (6 to 30 lowercase letters, digits and hyphens) or a
	// domain-scoped one (example.com:project).
	pubSubProject = regexp.MustCompile(`^([a-z0-9.-]+:)?[a-z][a-z0-9-]{4,28}[a-z0-9]$`)
	// sqsQueueName: 1 to 80 letters, digits, '-' and '_', with ".fifo" for a FIFO queue.
	sqsQueueName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,75}(\.fifo|[a-zA-Z0-9_-]{0,5})$`)
)

// CheckKafkaTopic reports why topic cannot be a Kafka topic: 1 to 249 letters, digits, '.',
// '_' and '-' (not "." or "..").
func CheckKafkaTopic(topic string) error {
	if !kafkaTopic.MatchString(topic) || topic == "." || topic == ".." {
		return fmt.Errorf("%q is not a Kafka topic: 1 to 249 letters, digits, '.', '_' and '-'", topic)
	}
	return nil
}

// CheckPubSubTopic reports why topic cannot name a Pub/Sub topic: a topic id (3 to 255
// letters, digits and - _ . ~ + %, starting with a letter, not with "goog") or a full name
// projects/PROJECT/topics/ID.
func CheckPubSubTopic(topic string) error {
	id := topic
	if rest, ok := strings.CutPrefix(topic, "projects/"); ok {
		project, tid, ok := strings.Cut(rest, "/topics/")
		if !ok || !pubSubProject.MatchString(project) {
			return fmt.Errorf("%q is not a Pub/Sub topic name: want projects/PROJECT/topics/ID or a topic id", topic)
		}
		id = tid
	}
	if !pubSubTopicID.MatchString(id) || strings.HasPrefix(strings.ToLower(id), "goog") {
		return fmt.Errorf("%q is not a Pub/Sub topic id: 3 to 255 letters, digits and - _ . ~ + %%, starting with a letter, not with goog", id)
	}
	return nil
}

// CheckSQSQueue reports why queue cannot name an SQS queue: a queue name (1 to 80 letters,
// digits, '-' and '_', a FIFO queue's ending in ".fifo") or a queue URL
// (https://sqs.REGION.amazonaws.com/ACCOUNT/NAME, or an endpoint's own).
func CheckSQSQueue(queue string) error {
	name := queue
	if strings.Contains(queue, "://") {
		if !strings.HasPrefix(queue, "https://") && !strings.HasPrefix(queue, "http://") {
			return fmt.Errorf("%q is not an SQS queue URL: want https://sqs.REGION.amazonaws.com/ACCOUNT/NAME", queue)
		}
		name = queue[strings.LastIndexByte(queue, '/')+1:]
	}
	if !sqsQueueName.MatchString(name) {
		return fmt.Errorf("%q is not an SQS queue name: 1 to 80 letters, digits, '-' and '_', a FIFO queue's ending in .fifo", name)
	}
	return nil
}

// SQSFIFO reports whether queue (a name or a URL) is a FIFO queue: its name ends in ".fifo".
func SQSFIFO(queue string) bool { return strings.HasSuffix(queue, ".fifo") }

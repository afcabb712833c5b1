package consumer

import (
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemd/idemd/internal/jsonpointer"
	"github.com/idemd/idemd/outbox"
	"github.com/idemd/idemd/pipeline"
)

// Message is one consumed message as a Handler sees it: a Kafka record, or a Pub/Sub or SQS
// message.
type Message struct {
	// Pipeline is the subscription's name; message ids are unique within it.
	Pipeline string
	// ID is the message id the message was deduplicated on.
	ID string
	// Door is where the message came from: "kafka", "pubsub" or "sqs" (Config.Door).
	Door string
	// Topic, Partition and Offset say where a Kafka record was read. On Pub/Sub and SQS,
	// Topic is the subscription or the queue as the pipeline names it, and Partition and
	// Offset are 0.
	Topic     string
	Partition int
	Offset    int64
	// BrokerID is the broker's own id of a Pub/Sub or SQS message (messageId, MessageId),
	// the same on every redelivery of it; empty on Kafka.
	BrokerID string
	// Key and Value are the record's key and value, as produced. On Pub/Sub and SQS, Key
	// is the ordering key or the FIFO MessageGroupId (empty when there is none) and Value
	// the message's data or body.
	Key   []byte
	Value []byte
	// Headers are the record's headers; when a name repeats, the first value wins. On
	// Pub/Sub and SQS, the message attributes.
	Headers map[string]string
	// Time is the record's timestamp, or the broker's publish time.
	Time time.Time
	// DeliveryAttempt counts the deliveries of a Pub/Sub or SQS message, this one included,
	// where the broker says (a Pub/Sub subscription with a dead-letter policy, SQS
	// ApproximateReceiveCount); 0 otherwise.
	DeliveryAttempt int
	// ReceivedAt is when this consumer fetched the record.
	ReceivedAt time.Time
}

// Doors of Config.Door and Message.Door; the same names as deadletter's doors.
const (
	DoorKafka  = "kafka"
	DoorPubSub = "pubsub"
	DoorSQS    = "sqs"
)

// DefaultIDHeaders are the headers whose first present one is the message id when
// Config.MessageID is not set.
var DefaultIDHeaders = []string{"operation-id", "message-id", "idempotency-key"}

// record is one fetched message on its way through a batch: a Kafka record (msg and
// rawHeaders), or a Pub/Sub or SQS message (broker).
type record struct {
	msg Message
	// rawHeaders are a Kafka record's headers as kafka-go read them; the rest of the
	// kafka.Message is in msg (keeping the whole of it too cost 128 bytes a record).
	rawHeaders []kafka.Header
	broker     *brokerMessage // nil for Kafka and for a replayed letter
	seq        uint64         // broker doors: the order of receipt (lanes)
	parsed     bool
	doc        any // the decoded value, nil when it is not JSON
	isJSON     bool
	// validKnown: validJSON is json.Valid && utf8.Valid of the value (fingerprint.BodyJSON).
	validKnown, validJSON bool
}

// json decodes the value once, on first use.
func (r *record) json() (any, bool) {
	if !r.parsed {
		r.parsed = true
		// Invalid UTF-8 and unpaired surrogates would decode as U+FFFD: two different ids
		// could read as one. jsonpointer.Decode refuses them.
		r.doc, r.isJSON = jsonpointer.Decode(r.msg.Value)
	}
	return r.doc, r.isJSON
}

// lookup reads f, a plain or composite field, from the record; ok is false when it is
// absent (or not a scalar).
func (r *record) lookup(f *pipeline.Field) (string, bool) { return f.Read(r.Field) }

// Field reads a plain field of the record (pipeline.Message).
func (r *record) Field(f *pipeline.Field) (string, bool) {
	switch {
	case f.Header != "" || f.Attribute != "":
		// Headers of a Kafka record, attributes of a Pub/Sub or SQS message: the
		// pipeline's validation lets each door name only its own (header, attribute).
		v, ok := r.header(f.Header + f.Attribute)
		return v, ok && v != ""
	case f.Key:
		return string(r.msg.Key), len(r.msg.Key) > 0
	default:
		doc, ok := r.json()
		if !ok {
			return "", false
		}
		v, ok := jsonpointer.Get(doc, f.JSON)
		if !ok {
			return "", false
		}
		s, ok := jsonpointer.Scalar(v)
		return s, ok && s != ""
	}
}

// EventType is the record's event-type header (pipeline.Message).
func (r *record) EventType() string {
	v, _ := r.header(outbox.HeaderEventType)
	return v
}

// header is the first value of the named header of a Kafka record, or the named attribute
// of a Pub/Sub or SQS message. A Kafka record's headers are read where they lie until
// something needs them as a map (headers).
func (r *record) header(name string) (string, bool) {
	if r.msg.Headers != nil || r.msg.Door != DoorKafka {
		v, ok := r.msg.Headers[name]
		return v, ok
	}
	for _, h := range r.rawHeaders {
		if h.Key == name {
			return string(h.Value), true
		}
	}
	return "", false
}

// headers is Message.Headers, made for a Kafka record the first time something needs the
// map: a Go handler, AfterCommit, an effect that reads @headers, a record with a trace
// context. The map was a tenth of the bytes the Kafka door allocated per record, for
// pipelines that read one header or none (BENCHMARKS.md, phase 40).
func (r *record) headers() map[string]string {
	if r.msg.Headers == nil && r.msg.Door == DoorKafka {
		r.msg.Headers = headerMap(r.rawHeaders)
	}
	return r.msg.Headers
}

// id returns the message id by spec, or when spec is nil by the default: the broker's id on
// Pub/Sub and SQS, the default header chain on Kafka.
func (r *record) id(spec *pipeline.Field) (string, bool) {
	if spec != nil {
		v, ok := r.lookup(spec)
		if ok && spec.JSON != "" && (v == "true" || v == "false") && r.jsonBool(spec.JSON) {
			// A JSON boolean is no id (the receiver answers it 400): found, but malformed.
			return "", true
		}
		return v, ok
	}
	if r.msg.Door != DoorKafka {
		return r.msg.BrokerID, r.msg.BrokerID != ""
	}
	for _, h := range DefaultIDHeaders {
		// A blank header is no id: the next one of the chain is looked for.
		if v, _ := r.header(h); strings.TrimSpace(v) != "" {
			return v, true
		}
	}
	return "", false
}

// jsonBool reports whether the record's JSON value at ptr is a boolean.
func (r *record) jsonBool(ptr string) bool {
	doc, ok := r.json()
	if !ok {
		return false
	}
	v, ok := jsonpointer.Get(doc, ptr)
	_, isBool := v.(bool)
	return ok && isBool
}

func newRecord(pipeline string, m kafka.Message, now time.Time) *record {
	return &record{
		rawHeaders: m.Headers,
		msg: Message{
			Pipeline: pipeline, Door: DoorKafka, Topic: m.Topic, Partition: m.Partition, Offset: m.Offset,
			Key: m.Key, Value: m.Value, Time: m.Time, ReceivedAt: now, // Headers: made when needed (headers)
		},
	}
}

// headerMap is the map of Message.Headers: the first value of each name. The values are
// substrings of one string, one allocation instead of one per header.
func headerMap(hs []kafka.Header) map[string]string {
	headers := make(map[string]string, len(hs))
	n := 0
	for _, h := range hs {
		n += len(h.Value)
	}
	var all strings.Builder
	all.Grow(n)
	for _, h := range hs {
		all.Write(h.Value)
	}
	s := all.String()
	for _, h := range hs {
		v := s[:len(h.Value)]
		s = s[len(h.Value):]
		if _, ok := headers[h.Key]; !ok {
			headers[h.Key] = v
		}
	}
	return headers
}

// newBrokerRecord is the record of a Pub/Sub or SQS message of door, received from source
// (the subscription or queue as the pipeline names it).
func newBrokerRecord(pipeline, door, source string, m *brokerMessage) *record {
	r := &record{
		broker: m,
		msg: Message{
			Pipeline: pipeline, Door: door, Topic: source, BrokerID: m.ID, Value: m.Body, Headers: m.Attributes,
			Time: m.PublishTime, DeliveryAttempt: m.DeliveryAttempt, ReceivedAt: m.ReceivedAt,
		},
	}
	if m.Lane != "" {
		r.msg.Key = []byte(m.Lane)
	}
	if r.msg.Headers == nil {
		r.msg.Headers = map[string]string{}
	}
	return r
}

package consumer

import (
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemd/idemd/internal/jsonpointer"
	"github.com/idemd/idemd/outbox"
	"github.com/idemd/idemd/pipeline"
)

// Message is one Kafka record as a Handler sees it.
type Message struct {
	// Pipeline is the subscription's name; message ids are unique within it.
	Pipeline string
	// ID is the message id the record was deduplicated on.
	ID string
	// Topic, Partition and Offset say where the record was read.
	Topic     string
	Partition int
	Offset    int64
	// Key and Value are the record's key and value, as produced.
	Key   []byte
	Value []byte
	// Headers are the record's headers; when a name repeats, the first value wins.
	Headers map[string]string
	// Time is the record's timestamp.
	Time time.Time
	// ReceivedAt is when this consumer fetched the record.
	ReceivedAt time.Time
}

// DefaultIDHeaders are the headers whose first present one is the message id when
// Config.MessageID is not set.
var DefaultIDHeaders = []string{"operation-id", "message-id", "idempotency-key"}

// record is one fetched Kafka record on its way through a batch.
type record struct {
	msg    Message
	raw    kafka.Message
	parsed bool
	doc    any // the decoded value, nil when it is not JSON
	isJSON bool
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
	case f.Header != "":
		v, ok := r.msg.Headers[f.Header]
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
func (r *record) EventType() string { return r.msg.Headers[outbox.HeaderEventType] }

// id returns the message id by spec, or by the default header chain when spec is nil.
func (r *record) id(spec *pipeline.Field) (string, bool) {
	if spec != nil {
		return r.lookup(spec)
	}
	for _, h := range DefaultIDHeaders {
		if v := r.msg.Headers[h]; v != "" {
			return v, true
		}
	}
	return "", false
}

func newRecord(pipeline string, m kafka.Message, now time.Time) *record {
	headers := make(map[string]string, len(m.Headers))
	for _, h := range m.Headers {
		if _, ok := headers[h.Key]; !ok {
			headers[h.Key] = string(h.Value)
		}
	}
	return &record{
		raw: m,
		msg: Message{
			Pipeline: pipeline, Topic: m.Topic, Partition: m.Partition, Offset: m.Offset,
			Key: m.Key, Value: m.Value, Headers: headers, Time: m.Time, ReceivedAt: now,
		},
	}
}

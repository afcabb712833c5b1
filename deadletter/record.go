package deadletter

import (
	"encoding/json"
	"maps"
	"strconv"
	"time"
)

// Record is the broker message a letter of DoorKafka, DoorPubSub or DoorSQS stands for, as
// plain typed data: where it was read, its key, its time and its headers. A door hands one
// with every message it reads (Letter.Record), in case the message is dead-lettered; it
// becomes entries of the letter's Metadata and Headers only when the letter is written, so
// that the maps, strings and boxed numbers those take are built for the few messages that
// are dead-lettered, not for every message read. RecordOf reads it back from a stored
// letter.
type Record struct {
	// Topic, Partition and Offset say where a Kafka record was read (metadata "topic",
	// "partition", "offset"; Kafka letters only).
	Topic     string
	Partition int
	Offset    int64
	// Subscription is the Pub/Sub subscription or SQS queue, as the pipeline names it, and
	// BrokerMessageID the broker's id of the message (metadata "subscription",
	// "broker_message_id"; Pub/Sub and SQS letters only). Ordered (metadata "ordered") and
	// DeliveryAttempt (metadata "delivery_attempt") are kept when set.
	Subscription    string
	BrokerMessageID string
	Ordered         bool
	DeliveryAttempt int
	// Key is the record key, ordering key or group id (metadata "key"); nil when there is
	// none.
	Key []byte
	// Time is the record's timestamp or the broker's publish time (metadata "timestamp",
	// RFC 3339 in UTC).
	Time time.Time
	// DedupID is the key a message without a message id of its own was deduplicated on
	// (metadata "dedup_id"); empty otherwise.
	DedupID string
	// Headers are a Kafka record's headers in the order read; a name may repeat, and its
	// values are kept in that order (Headers[name]).
	Headers []Header
	// Attributes are a Pub/Sub or SQS message's attributes (Headers[name], one value each).
	Attributes map[string]string
}

// Header is one header of a Kafka record.
type Header struct {
	Key   string
	Value []byte
}

// Metadata keys of a Record.
const (
	metaTopic           = "topic"
	metaPartition       = "partition"
	metaOffset          = "offset"
	metaSubscription    = "subscription"
	metaBrokerMessageID = "broker_message_id"
	metaOrdered         = "ordered"
	metaDeliveryAttempt = "delivery_attempt"
	metaKey             = "key"
	metaTimestamp       = "timestamp"
	metaDedupID         = "dedup_id"
)

// expand returns headers and metadata with r's entries added, for a letter of door; the
// maps given are not changed.
func (r *Record) expand(door Door, headers map[string][]string, metadata map[string]any) (map[string][]string, map[string]any) {
	h := make(map[string][]string, len(headers)+len(r.Headers)+len(r.Attributes))
	maps.Copy(h, headers)
	m := make(map[string]any, len(metadata)+6)
	maps.Copy(m, metadata)
	m[metaTimestamp] = r.Time.UTC().Format(time.RFC3339Nano)
	if door == DoorKafka {
		for _, x := range r.Headers {
			h[x.Key] = append(h[x.Key], string(x.Value))
		}
		m[metaTopic], m[metaPartition], m[metaOffset] = r.Topic, r.Partition, r.Offset
	} else {
		for k, v := range r.Attributes {
			h[k] = []string{v}
		}
		m[metaSubscription], m[metaBrokerMessageID] = r.Subscription, r.BrokerMessageID
		if r.Ordered {
			m[metaOrdered] = true
		}
		if r.DeliveryAttempt > 0 {
			m[metaDeliveryAttempt] = r.DeliveryAttempt
		}
	}
	if r.Key != nil {
		m[metaKey] = string(r.Key)
	}
	if r.DedupID != "" {
		m[metaDedupID] = r.DedupID
	}
	return h, m
}

// Request is the HTTP request a letter of DoorHTTP stands for (Letter.Request): like a
// Record, it becomes metadata ("method", "path", "tenant") only when the letter is written,
// so that a receiver builds no map for the webhooks that are not dead-lettered.
type Request struct {
	Method, Path, Tenant string
}

// Metadata keys of a Request.
const (
	MetaMethod = "method"
	MetaPath   = "path"
	MetaTenant = "tenant"
)

// expand returns metadata with r's entries added; the map given is not changed.
func (r *Request) expand(metadata map[string]any) map[string]any {
	m := make(map[string]any, len(metadata)+3)
	maps.Copy(m, metadata)
	m[MetaMethod], m[MetaPath], m[MetaTenant] = r.Method, r.Path, r.Tenant
	return m
}

// RecordOf reads back the Record of a stored letter, from its Metadata and Headers: every
// field whose entry is there, Headers (in the order of the stored values, names in no
// particular order) and Attributes (the first value of each name) both.
func RecordOf(l *Letter) Record {
	r := Record{
		Topic: metaString(l.Metadata, metaTopic), Partition: int(metaInt(l.Metadata, metaPartition)),
		Offset:       metaInt(l.Metadata, metaOffset),
		Subscription: metaString(l.Metadata, metaSubscription), BrokerMessageID: metaString(l.Metadata, metaBrokerMessageID),
		DeliveryAttempt: int(metaInt(l.Metadata, metaDeliveryAttempt)),
		DedupID:         metaString(l.Metadata, metaDedupID),
		Attributes:      make(map[string]string, len(l.Headers)),
	}
	r.Ordered, _ = l.Metadata[metaOrdered].(bool)
	if k, ok := l.Metadata[metaKey].(string); ok {
		r.Key = []byte(k)
	}
	if ts, err := time.Parse(time.RFC3339Nano, metaString(l.Metadata, metaTimestamp)); err == nil {
		r.Time = ts
	}
	for name, values := range l.Headers {
		for _, v := range values {
			r.Headers = append(r.Headers, Header{Key: name, Value: []byte(v)})
		}
		if len(values) > 0 {
			r.Attributes[name] = values[0]
		}
	}
	return r
}

func metaString(meta map[string]any, k string) string {
	s, _ := meta[k].(string)
	return s
}

// metaInt reads a number of a letter's metadata (JSON: float64 once decoded).
func metaInt(meta map[string]any, k string) int64 {
	switch v := meta[k].(type) {
	case float64:
		return int64(v)
	case json.Number:
		n, _ := v.Int64()
		return n
	case string:
		n, _ := strconv.ParseInt(v, 10, 64)
		return n
	case int64:
		return v
	case int:
		return int64(v)
	}
	return 0
}

package consumer

import (
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/pipeline"
)

// TestLetterAsBefore: the letter of a record (kept as a deadletter.Record until written)
// is stored with the same headers and metadata as the maps the consumer built for every
// record before (oldLetter), for Kafka records and broker messages, with and without a
// message id, a key, repeated headers, an ordered lane and a delivery attempt; and a
// replay reads back the record it was written from.
func TestLetterAsBefore(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	store := deadletter.New(db.Schema)
	c := &Consumer{cfg: Config{Name: "orders"}}
	at := time.Date(2026, 12, 1, 16, 0, 0, 123456789, time.FixedZone("CET", 3600))

	kafkaRec := func(key []byte, headers ...kafka.Header) *record {
		return newRecord("orders", kafka.Message{
			Topic: "payments", Partition: 3, Offset: 1234567890123, Key: key, Value: []byte(`{"id":"evt_1"}`),
			Headers: headers, Time: at,
		}, at)
	}
	brokerRec := func(door string, m *brokerMessage) *record {
		m.Body, m.PublishTime = []byte("plain text"), at
		return newBrokerRecord("orders", door, "orders-sub", m)
	}
	cases := map[string]*record{
		"kafka, headers repeated": kafkaRec([]byte("cus_1"),
			kafka.Header{Key: "message-id", Value: []byte("evt_1")}, kafka.Header{Key: "x-tag", Value: []byte("a")},
			kafka.Header{Key: "x-tag", Value: []byte("b")}, kafka.Header{Key: "bad", Value: []byte("nul\x00 \xff")}),
		"kafka, no key, no headers": kafkaRec(nil),
		"kafka, empty key":          kafkaRec([]byte{}, kafka.Header{Key: "message-id", Value: []byte("\x01bad id")}),
		"pubsub, ordered, attempt": brokerRec(DoorPubSub, &brokerMessage{
			ID: "1001", Ordered: true, Lane: "cus_1", Attributes: map[string]string{"message-id": "evt_2", "k": "v"}, DeliveryAttempt: 3,
		}),
		"sqs, plain": brokerRec(DoorSQS, &brokerMessage{ID: "b5f7", Attributes: map[string]string{}}),
	}
	for name, r := range cases {
		id, ok := r.id(nil)
		m := c.messageWithID(new(unitMessage), r, id, ok)
		require.Nil(t, m.Letter, name)
		letter, events := m.Letterer.DeadLetter(m)
		require.Empty(t, events, name)
		var ids [2]int64
		err := pgx.BeginFunc(t.Context(), db.Pool, func(tx pgx.Tx) error {
			var err error
			for i, l := range []*deadletter.Letter{oldLetter(c, r, m.ID), letter} {
				if ids[i], err = store.WriteTx(t.Context(), tx, l); err != nil {
					return err
				}
			}
			return nil
		})
		require.NoError(t, err, name)
		letters, err := store.List(t.Context(), db.Pool, deadletter.Filter{AfterID: ids[0] - 1, Limit: 2})
		require.NoError(t, err, name)
		require.Len(t, letters, 2, name)
		before, after := letters[0], letters[1]
		require.NotEmpty(t, before.Metadata, name)
		require.Equal(t, before.Headers, after.Headers, name)
		require.Equal(t, before.Metadata, after.Metadata, name)
		require.Equal(t, before.MessageID, after.MessageID, name)

		back := replayRecord("orders", after)
		if r.msg.Door != DoorKafka {
			back = replayBrokerRecord("orders", r.msg.Door, after)
			require.Equal(t, r.broker.Ordered, back.broker.Ordered, name)
			require.Equal(t, r.msg.BrokerID, back.msg.BrokerID, name)
			require.Equal(t, r.msg.DeliveryAttempt, back.msg.DeliveryAttempt, name)
		}
		require.Equal(t, r.msg.Topic, back.msg.Topic, name)
		require.Equal(t, r.msg.Partition, back.msg.Partition, name)
		require.Equal(t, r.msg.Offset, back.msg.Offset, name)
		require.Equal(t, string(r.msg.Key), string(back.msg.Key), name)
		require.Equal(t, r.msg.Key == nil, back.msg.Key == nil, name)
		require.True(t, r.msg.Time.Equal(back.msg.Time), name)
	}
}

// oldLetter is the letter as the consumer built it for every record before the letter's
// record was kept as typed data: the reference of TestLetterAsBefore.
func oldLetter(c *Consumer, r *record, dedupID string) *deadletter.Letter {
	var headers map[string][]string
	meta := map[string]any{"timestamp": r.msg.Time.UTC().Format(time.RFC3339Nano)}
	if r.msg.Door == DoorKafka {
		headers = make(map[string][]string, len(r.rawHeaders))
		for _, h := range r.rawHeaders {
			headers[h.Key] = append(headers[h.Key], string(h.Value))
		}
		meta["topic"], meta["partition"], meta["offset"] = r.msg.Topic, r.msg.Partition, r.msg.Offset
	} else {
		headers = make(map[string][]string, len(r.msg.Headers))
		for k, v := range r.msg.Headers {
			headers[k] = []string{v}
		}
		meta["subscription"], meta["broker_message_id"] = r.msg.Topic, r.msg.BrokerID
		if r.broker != nil && r.broker.Ordered {
			meta["ordered"] = true
		}
		if r.msg.DeliveryAttempt > 0 {
			meta["delivery_attempt"] = r.msg.DeliveryAttempt
		}
	}
	if r.msg.Key != nil {
		meta["key"] = string(r.msg.Key)
	}
	if r.msg.ID == "" {
		meta["dedup_id"] = dedupID
	}
	return &deadletter.Letter{
		Pipeline: c.cfg.Name, Origin: deadletter.Origin{Door: deadletter.Door(r.msg.Door)}, Scope: c.cfg.Name,
		MessageID: r.msg.ID, Payload: r.msg.Value, Headers: headers, Metadata: meta,
		Reason: "test " + strconv.Itoa(len(headers)), Attempts: 1,
	}
}

// TestHeaderMap: the first value of each name, whatever the values' lengths around it.
func TestHeaderMap(t *testing.T) {
	t.Parallel()
	require.Empty(t, headerMap(nil))
	got := headerMap([]kafka.Header{
		{Key: "a", Value: []byte("first")}, {Key: "empty", Value: nil}, {Key: "a", Value: []byte("second")},
		{Key: "b", Value: []byte("bé")}, {Key: "c", Value: []byte{}}, {Key: "d", Value: []byte("\xff\x00")},
	})
	require.Equal(t, map[string]string{"a": "first", "empty": "", "b": "bé", "c": "", "d": "\xff\x00"}, got)
}

// TestPassHeaders: an outbound record keeps the inbound content-type and event-type, and
// gets a JSON content type when it has none and its value is JSON (application/octet-stream
// when it is not: every record says what it carries, SPEC 2.6); records whose headers
// are only that share one map, which stays as it is.
func TestPassHeaders(t *testing.T) {
	rec := func(value string, headers ...kafka.Header) *record {
		return newRecord("orders", kafka.Message{Topic: "t", Value: []byte(value), Headers: headers}, time.Now())
	}
	same := func(a, b map[string]string) bool {
		return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
	}
	ct := func(v string) kafka.Header { return kafka.Header{Key: "content-type", Value: []byte(v)} }
	et := kafka.Header{Key: "event-type", Value: []byte("order.created")}
	for _, c := range []struct {
		r      *record
		want   map[string]string
		shared bool
	}{
		{rec(`{"id":1}`), map[string]string{"content-type": "application/json"}, true},
		{rec(`{"id":1}`, ct("application/json"), kafka.Header{Key: "x-other", Value: []byte("v")}), map[string]string{"content-type": "application/json"}, true},
		{rec(`{"id":1}`, et), map[string]string{"content-type": "application/json", "event-type": "order.created"}, false},
		{rec(`{"id":1}`, ct("application/cloudevents+json")), map[string]string{"content-type": "application/cloudevents+json"}, false},
		{rec(`not json`), map[string]string{"content-type": "application/octet-stream"}, false},
		{rec(`not json`, et), map[string]string{"content-type": "application/octet-stream", "event-type": "order.created"}, false},
	} {
		got := passHeaders(c.r)
		require.Equal(t, c.want, got)
		require.Equal(t, c.shared, same(got, jsonOnly), "%v", c.want)
	}
	require.Equal(t, map[string]string{"content-type": "application/json"}, jsonOnly)
}

// A record's dead-letter event gets its own headers: writing them does not change the
// map the events of other JSON records share (jsonOnly), which the relay may be reading.
func TestLetterEventLeavesSharedHeaders(t *testing.T) {
	c := &Consumer{cfg: Config{Name: "orders", DeadLetter: pipeline.DeadLetter{Topic: "orders.dlq"}}}
	r := newRecord("orders", kafka.Message{Topic: "payments", Partition: 2, Offset: 7, Value: []byte(`{"id":1}`),
		Headers: []kafka.Header{{Key: "message-id", Value: []byte("evt_1")}}}, time.Now())
	require.True(t, reflect.ValueOf(passHeaders(r)).UnsafePointer() == reflect.ValueOf(jsonOnly).UnsafePointer(),
		"the record's events share jsonOnly")
	e := c.letterEvent(r, "evt_1")
	require.Equal(t, "payments", e.Headers[HeaderSourceTopic])
	require.Equal(t, "7", e.Headers[HeaderSourceOffset])
	require.Equal(t, map[string]string{"content-type": "application/json"}, jsonOnly, "the shared map is unchanged")
}

// TestMessageLogFields: a Kafka message's log lines name its partition and offset; a Pub/Sub
// or SQS message's name its door instead, which has neither.
func TestMessageLogFields(t *testing.T) {
	c := &Consumer{log: logrus.NewEntry(logrus.New())}
	rec := newRecord("orders", kafka.Message{Topic: "t", Partition: 3, Offset: 42}, time.Now())
	rec.msg.ID = "m-1"
	require.Equal(t, logrus.Fields{"message_id": "m-1", "topic": "t", "partition": 3, "offset": int64(42)}, c.messageLog(rec).Data)
	for _, door := range []string{DoorPubSub, DoorSQS} {
		rec.msg.Door, rec.msg.Topic = door, "orders-sub"
		require.Equal(t, logrus.Fields{"message_id": "m-1", "topic": "orders-sub", "door": door}, c.messageLog(rec).Data)
	}
}

package pipeline_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/outbox"
	"github.com/idemd/idemd/pipeline"
)

// msg is a pipeline.Message of fixed fields.
type msg struct {
	fields    map[string]string // "json:/p", "header:H" or "attribute:A" -> value
	eventType string
}

func (m msg) Field(f *pipeline.Field) (string, bool) {
	k := "json:" + f.JSON
	switch {
	case f.Header != "":
		k = "header:" + f.Header
	case f.Attribute != "":
		k = "attribute:" + f.Attribute
	}
	v, ok := m.fields[k]
	return v, ok
}

func (m msg) EventType() string { return m.eventType }

// Composite values are joined length-prefixed: parts that a plain separator would merge stay
// apart, a single part reads as the plain field, and a missing or empty part is a missing
// value.
func TestCompositeField(t *testing.T) {
	t.Parallel()
	require.NotEqual(t, pipeline.JoinParts("a:b", "c"), pipeline.JoinParts("a", "b:c"))
	require.NotEqual(t, pipeline.JoinParts("a/1:b", "c"), pipeline.JoinParts("a", "1:b/c"))
	require.Equal(t, "3:a:b/1:c", pipeline.JoinParts("a:b", "c"))
	require.Equal(t, "evt_1", pipeline.JoinParts("evt_1"))

	f := &pipeline.Field{Parts: []pipeline.Field{{JSON: "/eventCode"}, {JSON: "/pspReference"}}}
	require.NoError(t, f.Validate(false))
	m := msg{fields: map[string]string{"json:/eventCode": "AUTHORISATION", "json:/pspReference": "8535"}}
	v, ok := f.Read(m.Field)
	require.True(t, ok)
	require.Equal(t, "13:AUTHORISATION/4:8535", v)

	m.fields["json:/pspReference"] = ""
	_, ok = f.Read(m.Field)
	require.False(t, ok, "an empty part is a missing id")
	delete(m.fields, "json:/pspReference")
	_, ok = f.Read(m.Field)
	require.False(t, ok, "a missing part is a missing id")

	require.ErrorContains(t, (&pipeline.Field{Parts: []pipeline.Field{{JSON: "x"}}}).Validate(false), "[0]: json")
	require.ErrorContains(t, (&pipeline.Field{JSON: "/a", Parts: []pipeline.Field{{JSON: "/b"}}}).Validate(false), "parts only")
	require.ErrorContains(t, (&pipeline.Field{Parts: []pipeline.Field{{Parts: []pipeline.Field{{JSON: "/b"}}}}}).Validate(false), "not a list")
	require.True(t, (&pipeline.Field{Parts: []pipeline.Field{{JSON: "/a"}, {Header: "X"}}}).UsesHeader())
	require.False(t, f.UsesHeader())
}

// Route sends one event per matching target, each with its own operation id derived from
// scope, id and the target's name; the first unnamed target keeps the pre-fan-out id and
// endpoint name.
func TestTargetsRoute(t *testing.T) {
	t.Parallel()
	ts := pipeline.Targets{
		{Topic: "billing.events", Key: &pipeline.Field{JSON: "/data/object/id"}},
		{Name: "invoices", HTTP: &pipeline.HTTP{URL: "https://erp.example/hooks"}, Filter: &pipeline.Filter{Type: []string{"invoice.*"}}},
		{Name: "big", HTTP: &pipeline.HTTP{URL: "https://b.example"}, Filter: &pipeline.Filter{JSON: "/data/object/currency", In: []string{"eur", "usd"}}},
		{Topic: "all"},
	}
	require.NoError(t, ts.Validate(false))
	base := outbox.Event{Payload: []byte(`{}`), Headers: map[string]string{"content-type": "application/json"}}

	invoice := msg{eventType: "invoice.paid", fields: map[string]string{"json:/data/object/id": "in_1", "json:/data/object/currency": "eur"}}
	got := ts.Route("billing", "billing", "evt_1", base, invoice)
	require.Len(t, got, 4)
	require.Equal(t, outbox.OperationID("billing", "evt_1", 0), got[0].Event.OperationID, "the first unnamed target keeps the pre-fan-out id")
	require.Equal(t, "billing.events", got[0].Event.Topic)
	require.Empty(t, got[0].Event.Endpoint)
	require.Equal(t, []byte("in_1"), got[0].Event.Key)
	require.Equal(t, outbox.TargetOperationID("billing", "evt_1", "invoices"), got[1].Event.OperationID)
	require.Equal(t, "billing:invoices", got[1].Event.Endpoint)
	require.Empty(t, got[1].Event.Topic)
	require.Equal(t, "billing:big", got[2].Event.Endpoint)
	require.Equal(t, outbox.OperationID("billing", "evt_1", 3), got[3].Event.OperationID, "an unnamed target is named by its position")
	ids := map[string]bool{}
	for _, r := range got {
		ids[r.Event.OperationID.String()] = true
		require.Equal(t, "evt_1", r.Event.CausationID)
		require.Equal(t, "billing", r.Event.Pipeline)
	}
	require.Len(t, ids, 4, "every target has its own operation id")
	got[0].Event.Headers["x"] = "y"
	require.NotContains(t, got[1].Event.Headers, "x", "targets do not share header maps")

	charge := msg{eventType: "charge.succeeded", fields: map[string]string{"json:/data/object/currency": "jpy"}}
	got = ts.Route("billing", "billing", "evt_2", base, charge)
	require.Len(t, got, 2, "filtered out by type and by value")
	require.Equal(t, 0, got[0].Index)
	require.Equal(t, 3, got[1].Index)
	require.Nil(t, got[0].Event.Key, "no key when its field is missing")

	untyped := msg{fields: map[string]string{}}
	require.Len(t, ts.Route("billing", "billing", "evt_3", base, untyped), 2, "a message without an event type matches no type filter")

	require.Equal(t, "orders", pipeline.Targets{{HTTP: &pipeline.HTTP{}}}.Endpoint("orders", 0), "the first unnamed target's endpoint keeps the pipeline's name")
}

func TestTargetsValidate(t *testing.T) {
	t.Parallel()
	require.ErrorContains(t, pipeline.Targets{{Topic: "a"}, {Name: "0", Topic: "b"}}.Validate(false), `name "0" is also the name of target 0`)
	require.ErrorContains(t, pipeline.Targets{{Name: "a/b", Topic: "b"}}.Validate(false), "not a valid name")
	require.ErrorContains(t, pipeline.Targets{{Topic: "a", Filter: &pipeline.Filter{}}}.Validate(false), "filter: want type")
	require.ErrorContains(t, pipeline.Targets{{Topic: "a", Filter: &pipeline.Filter{Type: []string{"[a"}}}}.Validate(false), "not a glob")
	require.ErrorContains(t, pipeline.Targets{{Topic: "a", Filter: &pipeline.Filter{JSON: "/x"}}}.Validate(false), "in: required")
	require.ErrorContains(t, pipeline.Targets{{Topic: "a", Filter: &pipeline.Filter{In: []string{"x"}}}}.Validate(false), "in: needs")
	require.NoError(t, pipeline.Targets{{Topic: "a", Filter: &pipeline.Filter{Type: []string{"push"}, Header: "X-Kind", In: []string{"x"}}}}.Validate(true))
}

// A Pub/Sub or SQS target's events carry their destination encoded in Event.Topic, with
// HTTP beside it when set; the relay decodes it (outbox.ParseDestination).
func TestTargetsRouteToBrokers(t *testing.T) {
	t.Parallel()
	ts := pipeline.Targets{
		{PubSub: &pipeline.PubSubTarget{Topic: "orders"}, Key: &pipeline.Field{JSON: "/id"}},
		{SQS: &pipeline.SQSTarget{Queue: "payments.fifo"}, HTTP: &pipeline.HTTP{URL: "https://x.example"}},
		{Topic: "kafka.orders"},
	}
	require.NoError(t, ts.Validate(false))
	got := ts.Route("p", "p", "m1", outbox.Event{Payload: []byte(`{}`)}, msg{fields: map[string]string{"json:/id": "o-1"}})
	require.Len(t, got, 3)
	require.Equal(t, "pubsub:orders", got[0].Event.Topic)
	require.Equal(t, []byte("o-1"), got[0].Event.Key)
	require.Equal(t, "sqs:payments.fifo", got[1].Event.Topic)
	require.Equal(t, "p:1", got[1].Event.Endpoint)
	require.Equal(t, "kafka.orders", got[2].Event.Topic)
	for i, want := range [][2]string{{"pubsub", "orders"}, {"sqs", "payments.fifo"}, {"kafka", "kafka.orders"}} {
		kind, name := outbox.ParseDestination(got[i].Event.Topic)
		require.Equal(t, want, [2]string{kind, name})
	}
}

func TestTargetsValidateBrokers(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		target pipeline.Publish
		err    string
	}{
		{pipeline.Publish{}, "want topic, pubsub, sqs or http"},
		{pipeline.Publish{Topic: "a", SQS: &pipeline.SQSTarget{Queue: "q"}}, "topic, sqs: one broker per target"},
		{pipeline.Publish{PubSub: &pipeline.PubSubTarget{Topic: "abc"}, SQS: &pipeline.SQSTarget{Queue: "q"}}, "pubsub, sqs: one broker per target"},
		{pipeline.Publish{SQS: &pipeline.SQSTarget{}}, "sqs.queue: required"},
		{pipeline.Publish{PubSub: &pipeline.PubSubTarget{}}, "pubsub.topic: required"},
		{pipeline.Publish{PubSub: &pipeline.PubSubTarget{Topic: "a"}}, "pubsub.topic: \"a\" is not a Pub/Sub topic id"},
		{pipeline.Publish{SQS: &pipeline.SQSTarget{Queue: strings.Repeat("q", 81)}}, "not an SQS queue name"},
		{pipeline.Publish{Topic: "pubsub:orders"}, "topic: \"pubsub:orders\" is not a Kafka topic"},
	} {
		require.ErrorContains(t, c.target.Validate(false), c.err)
	}
	for _, ok := range []pipeline.Publish{
		{PubSub: &pipeline.PubSubTarget{Topic: "projects/my-project/topics/orders"}},
		{SQS: &pipeline.SQSTarget{Queue: "https://sqs.eu-west-1.amazonaws.com/123456789012/payments.fifo"}},
		{SQS: &pipeline.SQSTarget{Queue: "http://localhost:4100/100010001000/q"}, HTTP: &pipeline.HTTP{URL: "https://x.example"}},
		{HTTP: &pipeline.HTTP{URL: "https://x.example"}},
	} {
		require.NoError(t, ok.Validate(false), "%+v", ok)
	}
}

// TestTargetsKeyPerDoor: a Pub/Sub or SQS subscription keys its events by an attribute,
// json or the ordering key, never a header; Kafka's by a header, json or the record key,
// never an attribute (SPEC 2.5b: the same keys as Kafka subscriptions, attributes for
// headers).
func TestTargetsKeyPerDoor(t *testing.T) {
	t.Parallel()
	keyed := func(f pipeline.Field) pipeline.Targets {
		return pipeline.Targets{{Topic: "out", Key: &f}}
	}
	for _, f := range []pipeline.Field{{Attribute: "tenant"}, {JSON: "/id"}, {Key: true}, {Parts: []pipeline.Field{{Attribute: "tenant"}, {JSON: "/id"}}}} {
		require.NoError(t, keyed(f).ValidateBroker(), "%+v", f)
	}
	require.ErrorContains(t, keyed(pipeline.Field{Header: "tenant"}).ValidateBroker(), "[0]: key: header: Pub/Sub and SQS messages have attributes, not headers")
	require.ErrorContains(t, keyed(pipeline.Field{Parts: []pipeline.Field{{Header: "tenant"}}}).ValidateBroker(), "attributes, not headers")
	require.NoError(t, keyed(pipeline.Field{Header: "tenant"}).Validate(true))
	require.ErrorContains(t, keyed(pipeline.Field{Attribute: "tenant"}).Validate(true), "[0]: key: attribute: only Pub/Sub and SQS subscriptions")

	// The key is read from the attribute.
	got := keyed(pipeline.Field{Attribute: "tenant"}).Route("p", "p", "m1", outbox.Event{Payload: []byte(`{}`)}, msg{fields: map[string]string{"attribute:tenant": "acme"}})
	require.Len(t, got, 1)
	require.Equal(t, []byte("acme"), got[0].Event.Key)
}

func TestOrderRead(t *testing.T) {
	t.Parallel()
	o := &pipeline.Order{Entity: pipeline.Field{JSON: "/id"}, Version: pipeline.Field{JSON: "/v"}}
	m := msg{fields: map[string]string{"json:/id": "cus_1", "json:/v": "2026-01-02T03:04:05Z"}}
	e, v, err := o.Read(m.Field)
	require.NoError(t, err)
	require.Equal(t, "cus_1", e)
	require.Equal(t, "1767323045000000", v)
	m.fields["json:/v"] = "soon"
	_, _, err = o.Read(m.Field)
	require.ErrorContains(t, err, "neither a number nor an RFC 3339 timestamp")
	delete(m.fields, "json:/id")
	_, _, err = o.Read(m.Field)
	require.ErrorContains(t, err, "entity (json /id) is missing")
}

// TestFilterTypeNeverMatchesUntypedMessage: a message without an event type matches no type
// filter, not even the glob "*", which path.Match matches against "" (SPEC 2.3b: the filter
// matches the event type). Dropping the check of the empty type passed before: the only
// type filter tested, "invoice.*", cannot match "" anyway.
func TestFilterTypeNeverMatchesUntypedMessage(t *testing.T) {
	t.Parallel()
	f := &pipeline.Filter{Type: []string{"*"}}
	require.True(t, f.Match(msg{eventType: "invoice.paid"}))
	require.False(t, f.Match(msg{}), "a message without an event type matched type [*]")
}

// TestFilterTypeAndValueBothMustMatch: a filter with type and a value (json or header with
// in) passes a message only when both match (Filter: "both must match"). Returning after the
// type matched, so that a eur-only filter lets a usd invoice through, passed before: every
// routing test gave its filters a type or a value, never both.
func TestFilterTypeAndValueBothMustMatch(t *testing.T) {
	t.Parallel()
	f := &pipeline.Filter{Type: []string{"invoice.*"}, JSON: "/data/object/currency", In: []string{"eur"}}
	require.NoError(t, f.Validate(false))
	for _, c := range []struct {
		eventType, currency string
		want                bool
	}{
		{"invoice.paid", "eur", true},
		{"invoice.paid", "usd", false},
		{"charge.succeeded", "eur", false},
		{"charge.succeeded", "usd", false},
	} {
		m := msg{eventType: c.eventType, fields: map[string]string{"json:/data/object/currency": c.currency}}
		require.Equal(t, c.want, f.Match(m), "%s in %s", c.eventType, c.currency)
	}
	ts := pipeline.Targets{{Topic: "all"}, {Name: "eur-invoices", Topic: "erp", Filter: f}}
	usd := msg{eventType: "invoice.paid", fields: map[string]string{"json:/data/object/currency": "usd"}}
	got := ts.Route("billing", "billing", "evt_1", outbox.Event{Payload: []byte(`{}`)}, usd)
	require.Len(t, got, 1, "a usd invoice reached the eur-only target")
	require.Equal(t, "all", got[0].Event.Topic)
}

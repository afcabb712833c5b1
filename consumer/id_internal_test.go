package consumer

import (
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/pipeline"
)

// TestJSONIDKinds: a message id read from JSON is a string, or a number as written; a
// boolean is malformed (dead-lettered with ErrMalformedMessageID, as the receiver answers
// it 400), and null, objects and arrays are missing (ErrNoMessageID). The string "true" is
// an id like any other.
func TestJSONIDKinds(t *testing.T) {
	t.Parallel()
	c := &Consumer{cfg: Config{Name: "orders", MessageID: &pipeline.Field{JSON: "/id"}}}
	for body, want := range map[string]error{
		`{"id":"evt_1"}`: nil,
		`{"id":1500}`:    nil,
		`{"id":"true"}`:  nil,
		`{"id":true}`:    ErrMalformedMessageID,
		`{"id":false}`:   ErrMalformedMessageID,
		`{"id":null}`:    ErrNoMessageID,
		`{"id":{}}`:      ErrNoMessageID,
		`{"id":[1]}`:     ErrNoMessageID,
		`{}`:             ErrNoMessageID,
	} {
		r := newRecord("orders", kafka.Message{Topic: "t", Value: []byte(body), Time: time.Unix(1, 0)}, time.Now())
		id, ok := r.id(c.cfg.MessageID)
		m := c.messageWithID(new(unitMessage), r, id, ok)
		require.Equal(t, want, m.Invalid, body)
	}
}

package faults

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/kafkatest"
)

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// TestConsumerHostileIDs: a record whose message id is hostile sits in a one-partition
// topic before valid records. It is applied once as data or dead-lettered; it never blocks
// the partition or stops the daemon: every valid record after it is applied.
func TestConsumerHostileIDs(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		id   []byte
		bug  string
	}{
		{name: "10,000 bytes", id: []byte(strings.Repeat("x", 10000))},
		{name: "10,000 random hex characters", id: []byte(randomHex(5000))},
		{name: "invalid UTF-8", id: []byte("id-\xff\xfe")},
		{name: "NUL byte", id: []byte("id-\x00-nul")},
		{name: "SQL-looking", id: []byte(`id'); DROP TABLE effects; --`)},
		{name: "missing", id: nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if c.bug != "" {
				t.Skip(c.bug)
			}
			broker := newBroker(t)
			brokers := broker.ListenAddrs()
			d := newDB(t, effectsDDL)
			in, out := "in-"+d.schema, "out-"+d.schema
			kafkatest.CreateTopicOn(t, brokers, in, 1)
			kafkatest.CreateTopicOn(t, brokers, out, 1)
			msgs := []kafka.Message{{Key: []byte("k"), Value: []byte(`{"id":"h"}`)}}
			if c.id != nil {
				msgs[0].Headers = []kafka.Header{{Key: "message-id", Value: c.id}}
			}
			const valid = 5
			for i := range valid {
				vid := fmt.Sprintf("ok-%d", i)
				msgs = append(msgs, kafka.Message{Key: []byte("k"), Value: fmt.Appendf(nil, `{"id":%q}`, vid),
					Headers: []kafka.Header{{Key: "message-id", Value: []byte(vid)}}})
			}
			produce(t, brokers, in, msgs)
			nd := newNode(t, d.schema, subscriptionFile(t, d.schema, in, out, "g-"+d.schema), "consumer,relay", brokers, nil)
			p := nd.startReady()
			until(t, d.watch(t, "effects"), p, 30*time.Second, "the valid records after the hostile one", func() bool {
				return d.count(t, "effects WHERE message_id LIKE 'ok-%'") >= valid
			})
			require.False(t, p.Exited(), "the daemon keeps running")
			require.Equal(t, valid, d.count(t, "effects WHERE message_id LIKE 'ok-%'"))
			applied, dead := d.count(t, "effects WHERE message_id NOT LIKE 'ok-%'"), d.count(t, "dead_letters")
			require.Equal(t, 1, applied+dead, "the hostile record once, as data or as a dead letter")
			require.Equal(t, 0, p.Stop(t, stopTimeout))
			t.Logf("FIGURES consumer-hostile-id %s: applied_as_data=%d dead_lettered=%d valid_after=%d", c.name, applied, dead, valid)
		})
	}
}

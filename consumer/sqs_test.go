package consumer

import (
	"context"
	"encoding/base64"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/sqstest"
	"github.com/idemd/idemd/outbox"
)

func newTestSQSSource(t *testing.T, cfg sqsSourceConfig) *sqsSource {
	t.Helper()
	cfg.WaitTime = cmpOr(cfg.WaitTime, time.Second)
	s, err := newSQSSource(context.Background(), sqstest.Client(t), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func cmpOr(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// TestSQSSourceAckAfterExplicitCall: received messages carry id, body, attributes; Ack deletes
// them, Release gives them back with the same id, and nothing is deleted without Ack.
func TestSQSSourceAckAfterExplicitCall(t *testing.T) {
	t.Parallel()
	url := sqstest.Queue(t, nil)
	name := url[strings.LastIndexByte(url, '/')+1:]
	ids := sqstest.Send(t, url,
		sqstest.Message{Body: `{"id":"a"}`, Attributes: map[string]string{"operation-id": "op-a"}},
		sqstest.Message{Body: `{"id":"b"}`})
	s := newTestSQSSource(t, sqsSourceConfig{Queue: name, Visibility: time.Second})

	a, b := ackRelease(t, s, ids, func() {})
	for _, m := range []*brokerMessage{a, b} {
		require.Equal(t, 1, m.DeliveryAttempt)
		require.False(t, m.PublishTime.IsZero())
	}
	// Both are gone: with a 1 s visibility and no heartbeat, an undeleted one would be back.
	requireNothing(t, s, 3*time.Second)
}

// TestSQSSourceVisibilityExtension: a message held past its 1 s visibility is not redelivered,
// because the heartbeat extends it, while a message nobody extends comes back over and over;
// past MaxExtension the heartbeat stops and it comes back.
func TestSQSSourceVisibilityExtension(t *testing.T) {
	t.Parallel()
	url, control := sqstest.Queue(t, nil), sqstest.Queue(t, nil)
	id := sqstest.Send(t, url, sqstest.Message{Body: "held"})[0]
	sqstest.Send(t, control, sqstest.Message{Body: "control"})
	s := newTestSQSSource(t, sqsSourceConfig{Queue: url, Visibility: time.Second})
	held := receiveN(t, s, 1)
	require.Equal(t, id, held[0].ID)

	// The control message comes three times: its 1 s visibility ended twice.
	for range 3 {
		require.Len(t, sqstest.Receive(t, control, 1, 5*time.Second, time.Second), 1)
	}
	requireNothing(t, s, 200*time.Millisecond)
	require.NoError(t, s.Ack(context.Background(), held))

	t.Run("MaxExtension bounds the lease", func(t *testing.T) {
		url := sqstest.Queue(t, nil)
		sqstest.Send(t, url, sqstest.Message{Body: "stuck"})
		s := newTestSQSSource(t, sqsSourceConfig{Queue: url, Visibility: time.Second, MaxExtension: time.Second})
		first := receiveN(t, s, 1)
		again := receiveN(t, s, 1)
		require.Equal(t, first[0].ID, again[0].ID)
		require.NoError(t, s.Ack(context.Background(), again))
	})
}

// countingSQS is goaws's client, counting the ChangeMessageVisibility calls.
type countingSQS struct {
	SQSClient
	changes atomic.Int64
}

func (c *countingSQS) ChangeMessageVisibility(ctx context.Context, in *sqs.ChangeMessageVisibilityInput, opts ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityOutput, error) {
	c.changes.Add(1)
	return c.SQSClient.ChangeMessageVisibility(ctx, in, opts...)
}

// TestSQSSourceExtendsOnlyLongHeld: a message acknowledged within a third of its lease is
// never extended (no ChangeMessageVisibility call); one held longer is, and is not
// redelivered.
func TestSQSSourceExtendsOnlyLongHeld(t *testing.T) {
	t.Parallel()
	url := sqstest.Queue(t, nil)
	client := &countingSQS{SQSClient: sqstest.Client(t)}
	s, err := newSQSSource(context.Background(), client, sqsSourceConfig{Queue: url, Visibility: 3 * time.Second, WaitTime: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })

	sqstest.Send(t, url, sqstest.Message{Body: "quick"})
	quick := receiveN(t, s, 1)
	received := time.Now()
	require.NoError(t, s.Ack(context.Background(), quick))
	if time.Since(received) < time.Second {
		// Two beats (every 0.5 s) may have passed, but the message was leased for less
		// than a third of 3 s.
		time.Sleep(time.Second)
		require.Zero(t, client.changes.Load(), "a message acknowledged within a third of its lease is not extended")
	}

	sqstest.Send(t, url, sqstest.Message{Body: "held"})
	held := receiveN(t, s, 1)
	require.Eventually(t, func() bool { return client.changes.Load() > 0 }, 10*time.Second, 10*time.Millisecond)
	requireNothing(t, s, 4*time.Second) // past its first lease of 3 s
	require.NoError(t, s.Ack(context.Background(), held))
}

// TestSQSSourceFIFO: a FIFO queue's messages are ordered and come in send order; a body that
// idemd's publisher sent in base64 is decoded.
func TestSQSSourceFIFO(t *testing.T) {
	t.Parallel()
	url := sqstest.FIFOQueue(t, nil)
	var msgs []sqstest.Message
	for i := range 5 {
		msgs = append(msgs, sqstest.Message{Body: strconv.Itoa(i), GroupID: "g", DeduplicationID: strconv.Itoa(i)})
	}
	msgs = append(msgs, sqstest.Message{
		Body: base64.StdEncoding.EncodeToString([]byte{0, 0xff}), GroupID: "g", DeduplicationID: "bin",
		Attributes: map[string]string{outbox.HeaderBodyEncoding: "base64"},
	})
	sqstest.Send(t, url, msgs...)
	s := newTestSQSSource(t, sqsSourceConfig{Queue: url})

	var bodies []string
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for len(bodies) < len(msgs) {
		got, err := s.Receive(ctx)
		require.NoError(t, err)
		for _, m := range got {
			require.True(t, m.Ordered)
			if sqstest.Kind(t) != "goaws" {
				require.Equal(t, "g", m.Lane)
			}
			bodies = append(bodies, string(m.Body))
		}
		require.NoError(t, s.Ack(ctx, got))
	}
	require.Equal(t, []string{"0", "1", "2", "3", "4", "\x00\xff"}, bodies)
}

// TestSQSSourceCloseReleases: what the source holds at Close becomes visible again after
// RetryDelay, not after its 30 s visibility; a missing queue fails at once.
func TestSQSSourceCloseReleases(t *testing.T) {
	t.Parallel()
	url := sqstest.Queue(t, nil)
	id := sqstest.Send(t, url, sqstest.Message{Body: "x"})[0]
	s := newTestSQSSource(t, sqsSourceConfig{Queue: url})
	receiveN(t, s, 1)
	require.NoError(t, s.Close())
	require.NoError(t, s.Close(), "Close is safe twice")
	next := newTestSQSSource(t, sqsSourceConfig{Queue: url})
	require.Equal(t, id, receiveN(t, next, 1)[0].ID)

	_, err := newSQSSource(context.Background(), sqstest.Client(t), sqsSourceConfig{Queue: sqstest.Name(t)})
	require.ErrorContains(t, err, "NonExistentQueue")
}

package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/idemd/idemd/pipeline"
	"github.com/stretchr/testify/require"
)

// receiveN calls Receive until it holds n messages.
func receiveN(t *testing.T, s brokerSource, n int) []*brokerMessage {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var got []*brokerMessage
	for len(got) < n {
		msgs, err := s.Receive(ctx)
		require.NoError(t, err, "received %d of %d", len(got), n)
		got = append(got, msgs...)
	}
	require.Len(t, got, n)
	return got
}

// requireNothing checks that Receive gets nothing within wait.
func requireNothing(t *testing.T, s brokerSource, wait time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	msgs, err := s.Receive(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Empty(t, msgs)
}

// ackRelease checks what every brokerSource does with two messages that were sent as
// {"id":"a"} with attribute operation-id=op-a, then {"id":"b"}, with broker ids ids: each id
// rule reads them; beforeAck runs while they are held; after Ack of a and Release of b, b
// comes back with its id and a does not; it acknowledges b and returns both deliveries.
func ackRelease(t *testing.T, s brokerSource, ids []string, beforeAck func()) (a, b *brokerMessage) {
	t.Helper()
	byID := map[string]*brokerMessage{}
	for _, m := range receiveN(t, s, 2) {
		byID[m.ID] = m
		require.False(t, m.Ordered)
	}
	a, b = byID[ids[0]], byID[ids[1]]
	require.Equal(t, `{"id":"a"}`, string(a.Body))
	id, ok := newBrokerRecord("p", DoorSQS, "q", a).id(&pipeline.Field{Attribute: "operation-id"})
	require.True(t, ok)
	require.Equal(t, "op-a", id)
	id, _ = newBrokerRecord("p", DoorSQS, "q", b).id(&pipeline.Field{JSON: "/id"})
	require.Equal(t, "b", id)
	id, _ = newBrokerRecord("p", DoorSQS, "q", b).id(nil)
	require.Equal(t, ids[1], id)
	beforeAck()

	require.NoError(t, s.Ack(context.Background(), []*brokerMessage{a}))
	require.NoError(t, s.Release(context.Background(), []*brokerMessage{b}))
	again := receiveN(t, s, 1)
	require.Equal(t, ids[1], again[0].ID, "the released message comes back, the acknowledged one does not")
	require.NoError(t, s.Ack(context.Background(), again))
	return a, b
}

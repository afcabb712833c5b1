package exactlyonce_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/exactlyonce"
)

// TestAlsoKeys: a message claims a second key (a signed body's hash). The same key under a
// new id is a duplicate and runs nothing; a message that is not new leaves no Also claim
// behind.
func TestAlsoKeys(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	m := func(id, body string, n int) *exactlyonce.Message {
		x := b.msg(id, n)
		x.Answer = nil
		x.Fingerprint = []byte(body)
		x.Also = []exactlyonce.Key{{Scope: "s#body", ID: body, Fingerprint: []byte(body)}}
		return x
	}
	first := m("d1", "B1", 1)
	require.NoError(t, b.unit.Apply(ctx, []*exactlyonce.Message{first}))
	require.Equal(t, exactlyonce.Applied, first.Outcome)

	// The same signed bytes, replayed under fresh ids, in one batch and in another.
	r1, r2 := m("d2", "B1", 2), m("d3", "B1", 3)
	require.NoError(t, b.unit.Apply(ctx, []*exactlyonce.Message{r1}))
	require.NoError(t, b.unit.Apply(ctx, []*exactlyonce.Message{r2, m("d4", "B1", 4)}))
	require.Equal(t, exactlyonce.Duplicate, r1.Outcome)
	require.Equal(t, exactlyonce.Duplicate, r2.Outcome)
	require.Equal(t, 1, b.db.Count(t, "{schema}.effects"), "one effect for one signed body")

	// Two new bodies in one batch under two ids: both applied.
	n1, n2 := m("e1", "B2", 5), m("e2", "B3", 6)
	require.NoError(t, b.unit.Apply(ctx, []*exactlyonce.Message{n1, n2}))
	require.Equal(t, exactlyonce.Applied, n1.Outcome)
	require.Equal(t, exactlyonce.Applied, n2.Outcome)

	// An id reused with another body is a conflict: its body's claim is not kept, so the
	// body can still be applied under its own, new id.
	c := m("d1", "B9", 7)
	require.NoError(t, b.unit.Apply(ctx, []*exactlyonce.Message{c}))
	require.Equal(t, exactlyonce.Conflict, c.Outcome)
	require.Zero(t, b.db.Count(t, "{schema}.processed_messages WHERE scope = 's#body' AND message_id = 'B9'"))
	later := m("f1", "B9", 8)
	require.NoError(t, b.unit.Apply(ctx, []*exactlyonce.Message{later}))
	require.Equal(t, exactlyonce.Applied, later.Outcome)
	require.Equal(t, 4, b.db.Count(t, "{schema}.effects"))
}

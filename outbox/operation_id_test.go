package outbox

import (
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// OperationID is uuid.NewSHA1 of the documented name, byte for byte: ids stored before the
// allocation-free version must not change.
func TestOperationIDIsNewSHA1OfItsName(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 300)
	for _, c := range []struct {
		pipeline, id string
		ordinal      int
	}{
		{"stripe", "evt_1", 0}, {"", "", 0}, {"p/q", "a/b", 12}, {"orders", long, 3}, {long, "id", 1 << 40}, {"é", "日本", -1},
	} {
		name := strconv.Itoa(len(c.pipeline)) + ":" + c.pipeline + "/" + c.id + "/" + strconv.Itoa(c.ordinal)
		require.Equal(t, uuid.NewSHA1(namespace, []byte(name)), OperationID(c.pipeline, c.id, c.ordinal), name)
	}
}

func BenchmarkOperationID(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = OperationID("stripe", "evt_1NG8Du2eZvKYlo2CUI79vXWy", 0)
	}
}

// A target's operation id is uuid.NewSHA1 of "len:pipeline/id/target"; the target named by
// position n has the id of ordinal n, so a pipeline's first unnamed target keeps the ids its
// one event had before fan-out. Different targets of one message never share an id.
func TestTargetOperationID(t *testing.T) {
	t.Parallel()
	require.Equal(t, OperationID("stripe", "evt_1", 0), TargetOperationID("stripe", "evt_1", "0"))
	require.Equal(t, OperationID("stripe", "evt_1", 7), TargetOperationID("stripe", "evt_1", "7"))
	require.Equal(t, uuid.NewSHA1(namespace, []byte("6:stripe/evt_1/erp")), TargetOperationID("stripe", "evt_1", "erp"))
	seen := map[uuid.UUID]string{}
	for _, target := range []string{"0", "1", "erp", "all", "00", "erp.v2"} {
		id := TargetOperationID("stripe", "evt_1", target)
		require.NotContains(t, seen, id, "targets %s and %s", target, seen[id])
		seen[id] = target
	}
	require.NotEqual(t, TargetOperationID("stripe", "evt_1", "erp"), TargetOperationID("stripe", "evt_2", "erp"))
}

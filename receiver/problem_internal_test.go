package receiver

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// marshalStatus is statusBody as encoding/json writes it.
func marshalStatus(status, id string) []byte {
	b, _ := json.Marshal(struct {
		Status    string `json:"status"`
		MessageID string `json:"message_id,omitempty"`
	}{status, id})
	return b
}

func TestStatusBodySameAsEncodingJSON(t *testing.T) {
	t.Parallel()
	for _, id := range []string{"", "evt_1", "a b", `quote"d`, `back\slash`, "<html>&", "caf\u00e9", "tab\there", "\u2028", "key-1234567890"} {
		for _, status := range []string{"processed", "duplicate", "dead_lettered", "stale"} {
			require.Equal(t, string(marshalStatus(status, id)), string(statusBody(status, id)), "status %q, id %q", status, id)
		}
	}
}

func FuzzStatusBodySameAsEncodingJSON(f *testing.F) {
	f.Add("processed", "evt_1")
	f.Add("duplicate", "")
	f.Add("stale", "<\"\\>")
	f.Fuzz(func(t *testing.T, status, id string) {
		if got, want := statusBody(status, id), marshalStatus(status, id); string(got) != string(want) {
			t.Fatalf("statusBody(%q, %q) = %s, encoding/json writes %s", status, id, got, want)
		}
	})
}

func BenchmarkStatusBody(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = statusBody("processed", "evt_1NqFQ2LkdIwHu7ixAbCdEfGh")
	}
}

func BenchmarkStatusBodyEncodingJSON(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = marshalStatus("processed", "evt_1NqFQ2LkdIwHu7ixAbCdEfGh")
	}
}

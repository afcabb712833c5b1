package receiver

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/idemd/idemd/internal/headerjson"
)

// problem is an RFC 9457 problem detail. Type is stable: clients branch on it.
type problem struct {
	Type      string `json:"type"`
	Title     string `json:"title"`
	Status    int    `json:"status"`
	Detail    string `json:"detail,omitempty"`
	Retryable bool   `json:"retryable"`
	// MessageID is set when the request's id is known (conflicts, failures).
	MessageID string `json:"message_id,omitempty"`
}

// ProblemTypeBase prefixes every problem type; the fragment names the problem (see
// docs/receiver.md).
const ProblemTypeBase = "https://github.com/idemd/idemd/blob/main/docs/receiver.md#"

// Problem kinds: stable type suffix, title, status, retryable.
var (
	probNotFound     = problem{Type: "not-found", Title: "No source at this path", Status: 404}
	probMethod       = problem{Type: "method-not-allowed", Title: "Method not allowed", Status: 405}
	probTooLarge     = problem{Type: "body-too-large", Title: "Request body too large", Status: 413}
	probBadBody      = problem{Type: "bad-request", Title: "Request body could not be read", Status: 400}
	probSignature    = problem{Type: "invalid-signature", Title: "Signature missing, invalid or outside the tolerance", Status: 401}
	probUnauthorized = problem{Type: "unauthorized", Title: "Missing or invalid bearer token", Status: 401}
	probMissingID    = problem{Type: "missing-message-id", Title: "Message id missing or malformed", Status: 400}
	probMissingKey   = problem{Type: "missing-idempotency-key", Title: "Idempotency-Key header required", Status: 400}
	probBadKey       = problem{Type: "invalid-idempotency-key", Title: "Idempotency-Key malformed", Status: 400}
	probConflict     = problem{Type: "conflict", Title: "Id reused with a different payload", Status: 422}
	probInFlight     = problem{Type: "in-flight", Title: "A request with this key is in progress", Status: 409, Retryable: true}
	probEffectFailed = problem{Type: "effect-failed", Title: "The request's effect failed permanently", Status: 422}
	probUnavailable  = problem{Type: "unavailable", Title: "Temporarily unavailable; nothing was stored", Status: 503, Retryable: true}
	probUnknownKey   = problem{Type: "unknown-key", Title: "No stored answer for this key", Status: 404}
	probNothingToDel = problem{Type: "nothing-to-delete", Title: "Nothing to delete with this id", Status: 404}
)

// problemBody renders p with detail and id.
func problemBody(p problem, detail, id string) []byte {
	p.Type = ProblemTypeBase + p.Type
	p.Detail, p.MessageID = detail, id
	b, _ := json.Marshal(p)
	return b
}

// writeProblem answers with p. retryAfter > 0 adds Retry-After (seconds).
func writeProblem(w http.ResponseWriter, p problem, detail, id string, retryAfter int) {
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	if retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(retryAfter))
	}
	w.WriteHeader(p.Status)
	_, _ = w.Write(problemBody(p, detail, id))
}

// The values of writeJSON's headers, shared by every answer: Header.Set would allocate one
// per answer, and nothing appends to them (net/http only reads a response's headers).
var (
	headerJSON = []string{"application/json"}
	headerTrue = []string{"true"}
)

// writeJSON answers status with a JSON body.
func writeJSON(w http.ResponseWriter, status int, body []byte, replayed bool) {
	h := w.Header()
	h["Content-Type"] = headerJSON
	if replayed {
		h["Idempotent-Replayed"] = headerTrue
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// statusBody is the body of an answer that is not a problem: {"status":…,"message_id":…},
// the id left out when empty, as encoding/json writes it. Every webhook's answer is one:
// written by hand when the id needs no escaping (status is always a constant that does
// not), through encoding/json otherwise.
func statusBody(status, id string) []byte {
	if !headerjson.Plain(id) || !headerjson.Plain(status) {
		b, _ := json.Marshal(struct {
			Status    string `json:"status"`
			MessageID string `json:"message_id,omitempty"`
		}{status, id})
		return b
	}
	b := make([]byte, 0, len(`{"status":"","message_id":""}`)+len(status)+len(id))
	b = append(b, `{"status":"`...)
	b = append(b, status...)
	if id == "" {
		return append(b, `"}`...)
	}
	b = append(b, `","message_id":"`...)
	b = append(b, id...)
	return append(b, `"}`...)
}

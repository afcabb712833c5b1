package receiver_test

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/receiver"
)

const fuzzStripeSecret = "whsec_fuzz_handler_5e1b"

// FuzzHandler sends hostile requests through the whole receiver, on PostgreSQL: message ids
// and Idempotency-Keys extracted from sender-controlled bodies and headers, and every error
// rendered as problem+json. Signed requests reach the database, so ids, keys and bodies
// are exercised past verification. Invariants: no panic, no 500, only the statuses of
// SPEC 2.4, every error a problem+json document with its own status, ids in answers valid
// UTF-8 of at most 255 bytes, and never the secret or the signature in an answer.
func FuzzHandler(f *testing.F) {
	db := pgtest.NewWithOptions(f, pgtest.Options{MaxConns: 4})
	rcv, err := receiver.New(db.Pool, &receiver.Config{
		Schema: db.Schema,
		Sources: []receiver.Source{
			{Name: "stripe", Verify: receiver.Verify{Scheme: receiver.SchemeStripe, Secrets: []string{fuzzStripeSecret}}},
			{Name: "orders", Path: "/v1/orders", Verify: receiver.Verify{Scheme: receiver.SchemeBearer, Tokens: map[string]string{"tok-a-0123456789ab": "a"}},
				Idempotency: &receiver.Idempotency{Required: true}},
		},
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(rcv.Close)
	allowed := map[int]bool{200: true, 201: true, 202: true, 400: true, 401: true, 404: true, 405: true, 409: true, 413: true, 422: true, 503: true}

	f.Add("POST", "/webhooks/stripe", []byte(`{"id":"evt_1","object":"event"}`), "", true)
	f.Add("POST", "/webhooks/stripe", []byte(`{"id":"evt_\xff"}`), "", true)
	f.Add("POST", "/webhooks/stripe", []byte(`{"id":{"x":1}}`), "", true)
	f.Add("POST", "/webhooks/stripe", []byte(`{"id":12.50e3}`), "", true)
	f.Add("GET", "/webhooks/stripe", []byte(``), "", false)
	f.Add("POST", "/v1/orders", []byte(`{"a":1}`), `"k1"`, true)
	f.Add("PUT", "/v1/orders/k2", []byte(`{"a":1}`), "", true)
	f.Add("POST", "/v1/orders", []byte(`{"a":1}`), `"a\"b"`, true)
	f.Add("POST", "/v1/orders", []byte(`{"a":1}`), strings.Repeat("k", 300), true)
	f.Fuzz(func(t *testing.T, method, path string, body []byte, key string, sign bool) {
		if len(body) > 4096 || len(path) > 512 || len(key) > 512 {
			return
		}
		req, err := http.NewRequest(method, "http://idemd.test"+path, bytes.NewReader(body))
		if err != nil || req.URL.Path == "" {
			return
		}
		var sig string
		if sign {
			ts := strconv.FormatInt(time.Now().Unix(), 10)
			m := hmac.New(sha256.New, []byte(fuzzStripeSecret))
			m.Write([]byte(ts + "." + string(body)))
			sig = hex.EncodeToString(m.Sum(nil))
			req.Header.Set("Stripe-Signature", "t="+ts+",v1="+sig)
			req.Header.Set("Authorization", "Bearer tok-a-0123456789ab")
		}
		if key != "" {
			req.Header["Idempotency-Key"] = []string{key}
		}
		w := httptest.NewRecorder()
		rcv.ServeHTTP(w, req)
		code, out := w.Code, w.Body.String()
		if !allowed[code] {
			t.Fatalf("%s %s: status %d: %s", method, path, code, out)
		}
		if strings.Contains(out, fuzzStripeSecret) || (sig != "" && strings.Contains(out, sig)) || strings.Contains(out, "tok-a-0123456789ab") {
			t.Fatalf("the answer echoes a secret, token or signature: %s", out)
		}
		var doc struct {
			Type      string `json:"type"`
			Title     string `json:"title"`
			Status    int    `json:"status"`
			Retryable *bool  `json:"retryable"`
			MessageID string `json:"message_id"`
		}
		if code >= 400 {
			if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
				t.Fatalf("status %d with Content-Type %q", code, ct)
			}
			if err := json.Unmarshal(w.Body.Bytes(), &doc); err != nil {
				t.Fatalf("problem is not JSON: %v: %s", err, out)
			}
			if !strings.HasPrefix(doc.Type, receiver.ProblemTypeBase) || doc.Title == "" || doc.Status != code || doc.Retryable == nil {
				t.Fatalf("malformed problem for %d: %s", code, out)
			}
			if code == 503 && w.Header().Get("Retry-After") == "" {
				t.Fatalf("503 without Retry-After")
			}
		} else if strings.HasPrefix(w.Header().Get("Content-Type"), "application/json") && path == "/webhooks/stripe" {
			var ok struct {
				Status    string `json:"status"`
				MessageID string `json:"message_id"`
			}
			if err := json.Unmarshal(w.Body.Bytes(), &ok); err != nil || ok.Status == "" {
				t.Fatalf("answer is not a status document: %v: %s", err, out)
			}
			doc.MessageID = ok.MessageID
		}
		if len(doc.MessageID) > 255 || !utf8.ValidString(doc.MessageID) {
			t.Fatalf("message id in the answer is not 1-255 bytes of UTF-8: %q", doc.MessageID)
		}
	})
}

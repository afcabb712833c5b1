package receiver_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/receiver"
)

// Serve Stripe webhooks with a Go effect: the signature is verified, the effect runs once
// per event id in the dedup transaction, and a redelivery is answered 200 "duplicate".
func Example() {
	pool, schema, cleanup := pgtest.ExampleDB("receiver")
	defer cleanup()

	const secret = "whsec_example_secret_0001"
	applied := 0
	rcv, err := receiver.New(pool, &receiver.Config{
		Schema: schema,
		Sources: []receiver.Source{{
			Name:   "stripe",
			Verify: receiver.Verify{Scheme: "stripe", Secrets: []string{secret}},
			Effect: receiver.Effect{Func: func(ctx context.Context, tx pgx.Tx, r *receiver.Request) (any, error) {
				applied++ // a real effect writes in tx: it commits with the dedup record
				return nil, nil
			}},
		}},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer rcv.Close()
	srv := httptest.NewServer(rcv)
	defer srv.Close()

	body := `{"id":"evt_1","object":"event","type":"charge.succeeded","pending_webhooks":1}`
	for i := 0; i < 2; i++ {
		ts := strconv.FormatInt(time.Now().Unix(), 10)
		mac := hmac.New(sha256.New, []byte(secret))
		mac.Write([]byte(ts + "." + body))
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/webhooks/stripe", strings.NewReader(body))
		req.Header.Set("Stripe-Signature", "t="+ts+",v1="+hex.EncodeToString(mac.Sum(nil)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		answer, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), strings.TrimSpace(string(answer)))
	}
	fmt.Println("applied:", applied)
	// Output:
	// 200  {"status":"processed","message_id":"evt_1"}
	// 200 true {"status":"duplicate","message_id":"evt_1"}
	// applied: 1
}

package delivery_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strconv"
	"time"

	"github.com/idemd/idemd/delivery"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/outbox"
)

// Enqueue an event for a partner's webhook endpoint in the effect transaction; the
// deliverer POSTs it, signed, with the operation id as Idempotency-Key. The partner checks
// the signature with delivery.Verify (or any Standard Webhooks library).
func ExampleDeliverer() {
	ctx := context.Background()
	pool, schema, cleanup := pgtest.ExampleDB("delivery")
	defer cleanup()

	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	received := make(chan string, 1)
	partner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		key, _ := delivery.ParseSecret(secret)
		ts, _ := strconv.ParseInt(r.Header.Get("webhook-timestamp"), 10, 64)
		fresh := time.Since(time.Unix(ts, 0)).Abs() < 5*time.Minute
		if !fresh || !delivery.Verify(key, r.Header.Get("webhook-id"), r.Header.Get("webhook-timestamp"), body, r.Header.Get("webhook-signature")) {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.WriteHeader(http.StatusNoContent)
		received <- fmt.Sprintf("%s %s (key is the operation id: %t)", r.Header.Get("Content-Type"), body,
			r.Header.Get("Idempotency-Key") == outbox.OperationID("orders", "req-7f3a", 0).String())
	}))
	defer partner.Close()

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	// ... the effect's own statements go here, in tx ...
	err = outbox.New(&outbox.Config{Schema: schema}).EnqueueTx(ctx, tx, outbox.Event{
		Endpoint:    "partner",
		Key:         []byte("order-42"),
		Payload:     []byte(`{"order":42}`),
		Headers:     map[string]string{outbox.HeaderContentType: "application/json"},
		Pipeline:    "orders",
		CausationID: "req-7f3a",
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}

	d, err := delivery.NewDeliverer(pool, &delivery.Config{
		Schema:    schema,
		Endpoints: []delivery.Endpoint{{Name: "partner", URL: partner.URL, Secret: secret, Timeout: 5 * time.Second}},
		Logger:    quietLogger(),
	})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(runCtx) }()
	fmt.Println(<-received)
	stop()
	<-done
	// Output: application/json {"order":42} (key is the operation id: true)
}

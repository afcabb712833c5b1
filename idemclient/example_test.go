package idemclient_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/idemd/idemd/idemclient"
)

// An order API that is briefly unavailable: the client retries with the same
// Idempotency-Key, so however many attempts reach the API, one order is created.
func Example() {
	var (
		mu   sync.Mutex
		keys = map[string]int{}
	)
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys[r.Header.Get("Idempotency-Key")]++
		n := keys[r.Header.Get("Idempotency-Key")]
		mu.Unlock()
		if n == 1 {
			w.Header().Set("Retry-After", "0")
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"order":"ord_1"}`)
	}))
	defer api.Close()

	client, err := idemclient.New(&idemclient.Config{BackoffMin: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond})
	if err != nil {
		panic(err)
	}
	req, err := http.NewRequest(http.MethodPost, api.URL+"/v1/orders", strings.NewReader(`{"amount":250}`))
	if err != nil {
		panic(err)
	}
	req.Header.Set("Content-Type", "application/json")
	// Omit this line for a fresh key per call; keep the key with the operation when it must
	// survive a restart of this process.
	req.Header.Set("Idempotency-Key", "order-2026-0001")

	resp, err := client.Do(context.Background(), req)
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(body))
	fmt.Println("attempts with key order-2026-0001:", keys["order-2026-0001"])
	// Output:
	// 201 {"order":"ord_1"}
	// attempts with key order-2026-0001: 2
}

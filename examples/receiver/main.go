// Command receiver serves Stripe webhooks with a Go effect: receiver.New returns an
// http.Handler that verifies the signature, claims the event id and runs the effect once per
// id in the dedup transaction; a redelivery is answered 200 "duplicate". It mounts the
// handler on a server, sends it the same signed event twice, and exits. Run it with
// IDEMD_DATABASE_URL set.
package main

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/migrations"
	"github.com/idemd/idemd/receiver"
)

const secret = "whsec_example_secret_0001" // in production: from the environment

func main() {
	ctx := context.Background()
	url := os.Getenv("IDEMD_DATABASE_URL")
	if url == "" { // pgx would fall back to libpq's defaults: some other database
		log.Fatal("set IDEMD_DATABASE_URL, for example postgres://postgres@127.0.0.1:5432/test")
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := migrations.Apply(ctx, pool, &migrations.Config{}); err != nil { // schema "idemd"
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS example_charges (event_id text PRIMARY KEY, body jsonb)`); err != nil {
		log.Fatal(err)
	}

	rcv, err := receiver.New(pool, &receiver.Config{Sources: []receiver.Source{{
		Name:   "stripe", // POST /webhooks/stripe
		Verify: receiver.Verify{Scheme: "stripe", Secrets: []string{secret}},
		Effect: receiver.Effect{Func: func(ctx context.Context, tx pgx.Tx, r *receiver.Request) (any, error) {
			// In tx: it commits with the dedup record, or neither does.
			_, err := tx.Exec(ctx, `INSERT INTO example_charges VALUES ($1, $2)`, r.MessageID, r.Body)
			return nil, err
		}},
	}}})
	if err != nil {
		log.Fatal(err)
	}
	defer rcv.Close()

	mux := http.NewServeMux()
	mux.Handle("/webhooks/", rcv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)        //nolint:errcheck // ends with Shutdown
	defer srv.Shutdown(ctx) //nolint:errcheck // best effort at exit

	var b [4]byte
	_, _ = rand.Read(b[:])
	body := `{"id":"evt_` + hex.EncodeToString(b[:]) + `","object":"event","type":"charge.succeeded"}`
	for range 2 { // Stripe redelivers when it misses an answer
		status, replayed, answer := send("http://"+ln.Addr().String()+"/webhooks/stripe", body)
		fmt.Println(status, replayed, answer)
	}
}

// send posts body signed as Stripe signs it, and returns the answer.
func send(url, body string) (int, string, string) {
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(ts + "." + body))
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		log.Fatal(err)
	}
	req.Header.Set("Stripe-Signature", "t="+ts+",v1="+hex.EncodeToString(mac.Sum(nil)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, "Idempotent-Replayed: " + resp.Header.Get("Idempotent-Replayed"), strings.TrimSpace(string(answer))
}

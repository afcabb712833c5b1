package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/outbox"
)

// naiveReceiver is the receiver baseline: the plain net/http handler one would write without
// idemd. Per request: verify the Stripe signature, then one transaction with the dedup
// insert (the columns idemd writes), the effect insert and the outbox insert, commit, answer.
// Nothing is shared between requests but the connection pool.
type naiveReceiver struct {
	pool                *pgxpool.Pool
	scope               string
	secret              []byte
	topic               string
	dedup, effect, emit string
}

func newNaiveReceiver(_ context.Context, pool *pgxpool.Pool, schema, scope, secret, topic string) (*naiveReceiver, error) {
	q := quote(schema)
	return &naiveReceiver{
		pool: pool, scope: scope, secret: []byte(secret), topic: topic,
		dedup: `INSERT INTO ` + q + `.processed_messages (scope, message_id, fingerprint, status, received_at, completed_at, expires_at, epoch)
VALUES ($1, $2, $3, 'done', now(), now(), now() + interval '7 days', (SELECT max(epoch) FROM ` + q + `.processed_epochs)) ON CONFLICT DO NOTHING`,
		effect: `INSERT INTO ` + q + `.effects (message_id, payload, topic) VALUES ($1, $2::jsonb, $3)`,
		emit: `INSERT INTO ` + q + `.outbox (operation_id, pipeline, causation_id, topic, key, payload, headers)
VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb)`,
	}, nil
}

func (n *naiveReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, "bad body", http.StatusBadRequest)
		return
	}
	if !n.verify(r.Header.Get("Stripe-Signature"), body) {
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	var ev struct {
		ID   string `json:"id"`
		Data struct {
			Object struct {
				ID string `json:"id"`
			} `json:"object"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &ev); err != nil || ev.ID == "" {
		http.Error(w, "no event id", http.StatusBadRequest)
		return
	}
	fp := sha256.Sum256(body)
	status := "processed"
	err = pgx.BeginFunc(r.Context(), n.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(r.Context(), n.dedup, n.scope, ev.ID, fp[:])
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			status = "duplicate"
			return nil
		}
		if _, err := tx.Exec(r.Context(), n.effect, ev.ID, string(body), n.scope); err != nil {
			return err
		}
		op := pgtype.UUID{Bytes: outbox.OperationID(n.scope, ev.ID, 0), Valid: true}
		_, err = tx.Exec(r.Context(), n.emit, op, n.scope, ev.ID, n.topic, []byte(ev.Data.Object.ID), body, outboxHeaders)
		return err
	})
	if err != nil {
		http.Error(w, "error: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"status":"`+status+`","message_id":`+strconv.Quote(ev.ID)+`}`)
}

// verify checks a Stripe-Signature header (t=…,v1=…) against body, within 5 minutes.
func (n *naiveReceiver) verify(header string, body []byte) bool {
	var ts string
	var sigs []string
	for part := range strings.SplitSeq(header, ",") {
		k, v, _ := strings.Cut(part, "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			sigs = append(sigs, v)
		}
	}
	t, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || time.Since(time.Unix(t, 0)).Abs() > 5*time.Minute {
		return false
	}
	mac := hmac.New(sha256.New, n.secret)
	mac.Write([]byte(ts))
	mac.Write([]byte{'.'})
	mac.Write(body)
	want := mac.Sum(nil)
	for _, s := range sigs {
		if got, err := hex.DecodeString(s); err == nil && hmac.Equal(got, want) {
			return true
		}
	}
	return false
}

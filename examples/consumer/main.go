// Command consumer runs a Go handler on a Kafka topic, exactly once per message id:
// consumer.New calls the Handler inside the transaction that claims the record's id
// (its operation-id header), so what the handler writes through tx commits once per id,
// however often the record is delivered. It produces four records, one of them twice, runs
// the consumer until they are applied, and exits. Run it with IDEMD_DATABASE_URL set, and
// IDEMD_KAFKA_BROKERS (else it starts an in-process broker, for the example only).
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idemd/idemd/consumer"
	"github.com/idemd/idemd/exactlyonce"
	"github.com/idemd/idemd/migrations"
)

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
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS example_ledger (event_id text PRIMARY KEY, body jsonb)`); err != nil {
		log.Fatal(err)
	}

	brokers := strings.Split(os.Getenv("IDEMD_KAFKA_BROKERS"), ",")
	if brokers[0] == "" {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			log.Fatal(err)
		}
		defer cluster.Close()
		brokers = cluster.ListenAddrs()
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	run := hex.EncodeToString(b[:]) // new topic and ids per run
	topic := "example.ledger." + run
	ids := []string{"evt_1_" + run, "evt_2_" + run, "evt_2_" + run, "evt_3_" + run} // evt_2 twice
	if err := produce(ctx, brokers, topic, ids); err != nil {
		log.Fatal(err)
	}

	c, err := consumer.New(pool, &consumer.Config{
		Name:    "ledger",
		Brokers: brokers,
		Topics:  []string{topic},
		Handler: func(ctx context.Context, tx pgx.Tx, msg consumer.Message) error {
			if len(msg.Value) == 0 {
				// Retrying cannot help: dead-letter it after DeadLetter.MaxAttempts failures.
				return exactlyonce.Permanent(errors.New("empty record"))
			}
			// A Handler may run again for the same message when its batch is retried (it
			// is rolled back first): effects outside tx must be idempotent.
			_, err := tx.Exec(ctx, `INSERT INTO example_ledger VALUES ($1, $2)`, msg.ID, msg.Value)
			return err
		},
	})
	if err != nil {
		log.Fatal(err)
	}

	// Run until the three distinct ids are applied, then stop: Run drains and commits
	// the offsets before it returns.
	runCtx, stop := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- c.Run(runCtx) }()
	for deadline := time.Now().Add(30 * time.Second); applied(ctx, pool, run) < 3 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	if err := <-stopped; err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d records delivered, %d ids applied once each\n", len(ids), applied(ctx, pool, run))
}

// produce writes one record per id, the id in its operation-id header.
func produce(ctx context.Context, brokers []string, topic string, ids []string) error {
	// idemd creates no topics outside idemd dev: the example makes its own.
	cl := &kafka.Client{Addr: kafka.TCP(brokers...)}
	if _, err := cl.CreateTopics(ctx, &kafka.CreateTopicsRequest{
		Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: 1, ReplicationFactor: 1}},
	}); err != nil {
		return err
	}
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll}
	defer w.Close()
	msgs := make([]kafka.Message, len(ids))
	for i, id := range ids {
		msgs[i] = kafka.Message{
			Headers: []kafka.Header{{Key: "operation-id", Value: []byte(id)}},
			Value:   []byte(`{"id":"` + id + `","amount":100}`),
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		err := w.WriteMessages(ctx, msgs...)
		if !errors.Is(err, kafka.UnknownTopicOrPartition) && !errors.Is(err, kafka.LeaderNotAvailable) {
			return err // nil, or a real failure; the topic may take a moment to exist
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func applied(ctx context.Context, pool *pgxpool.Pool, run string) int {
	var n int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM example_ledger WHERE event_id LIKE '%_' || $1`, run).Scan(&n)
	return n
}

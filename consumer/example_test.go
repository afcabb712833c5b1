package consumer_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/sirupsen/logrus"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idemd/idemd/consumer"
	"github.com/idemd/idemd/exactlyonce"
	"github.com/idemd/idemd/internal/pgtest"
)

// A subscription whose effect is SQL, as in the pipelines file. The record with id evt_2 is
// delivered twice; its effect runs once.
func Example_sqlEffect() {
	ctx := context.Background()
	pool, schema, cleanup := exampleDatabase(ctx)
	defer cleanup()
	brokers, topic := exampleBroker(ctx)

	exampleProduce(ctx, brokers, topic, "evt_1", "evt_2", "evt_2", "evt_3")
	c, err := consumer.New(pool, &consumer.Config{
		Name:    "ledger",
		Brokers: brokers,
		Topics:  []string{topic},
		Schema:  schema,
		Effect:  consumer.Effect{SQL: `INSERT INTO ` + schema + `.ledger (event_id, body) VALUES (@message_id, @payload::jsonb)`},
		Logger:  exampleLogger(),
	})
	if err != nil {
		panic(err)
	}
	exampleRun(ctx, c, func() bool { return exampleCount(ctx, pool, schema) == 3 })

	rows, _ := pool.Query(ctx, `SELECT event_id FROM `+schema+`.ledger ORDER BY event_id`)
	ids, _ := pgx.CollectRows(rows, pgx.RowTo[string])
	fmt.Println(strings.Join(ids, " "))
	// Output: evt_1 evt_2 evt_3
}

// A library user's Go handler: it runs inside the transaction that claims the message id,
// so its writes commit exactly once per id.
func Example_goHandler() {
	ctx := context.Background()
	pool, schema, cleanup := exampleDatabase(ctx)
	defer cleanup()
	brokers, topic := exampleBroker(ctx)

	exampleProduce(ctx, brokers, topic, "evt_1", "evt_1", "evt_2")
	c, err := consumer.New(pool, &consumer.Config{
		Name:    "ledger",
		Brokers: brokers,
		Topics:  []string{topic},
		Schema:  schema,
		Handler: func(ctx context.Context, tx pgx.Tx, msg consumer.Message) error {
			if len(msg.Value) == 0 {
				// Retrying cannot help: dead-letter it after DeadLetter.MaxAttempts.
				return exactlyonce.Permanent(fmt.Errorf("empty record"))
			}
			_, err := tx.Exec(ctx, `INSERT INTO `+schema+`.ledger (event_id, body) VALUES ($1, $2)`, msg.ID, msg.Value)
			return err
		},
		Logger: exampleLogger(),
	})
	if err != nil {
		panic(err)
	}
	exampleRun(ctx, c, func() bool { return exampleCount(ctx, pool, schema) == 2 })
	fmt.Println(exampleCount(ctx, pool, schema), "effects")
	// Output: 2 effects
}

// exampleDatabase creates a migrated schema with a ledger table and drops it at cleanup.
func exampleDatabase(ctx context.Context) (*pgxpool.Pool, string, func()) {
	pool, schema, cleanup := pgtest.ExampleDB("consumer")
	if _, err := pool.Exec(ctx, `CREATE TABLE `+schema+`.ledger (event_id text PRIMARY KEY, body jsonb)`); err != nil {
		cleanup()
		panic(err)
	}
	return pool, schema, cleanup
}

// exampleBroker returns TEST_KAFKA_BROKERS or an in-process broker, and a new topic on it.
func exampleBroker(ctx context.Context) ([]string, string) {
	brokers := strings.Split(os.Getenv("TEST_KAFKA_BROKERS"), ",")
	if brokers[0] == "" {
		c, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			panic(err)
		}
		brokers = c.ListenAddrs()
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	topic := "example." + hex.EncodeToString(b[:])
	cl := &kafka.Client{Addr: kafka.TCP(brokers...)}
	if _, err := cl.CreateTopics(ctx, &kafka.CreateTopicsRequest{
		Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: 1, ReplicationFactor: 1}},
	}); err != nil {
		panic(err)
	}
	return brokers, topic
}

func exampleProduce(ctx context.Context, brokers []string, topic string, ids ...string) {
	msgs := make([]kafka.Message, len(ids))
	for i, id := range ids {
		msgs[i] = msg(id, 0, "")
	}
	if err := write(brokers, topic, msgs); err != nil {
		panic(err)
	}
}

// exampleRun runs c until done holds, then stops it (it drains and commits its offsets).
func exampleRun(ctx context.Context, c *consumer.Consumer, done func() bool) {
	ctx, cancel := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- c.Run(ctx) }()
	for deadline := time.Now().Add(30 * time.Second); !done() && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-stopped; err != nil {
		panic(err)
	}
}

func exampleCount(ctx context.Context, pool *pgxpool.Pool, schema string) int {
	var n int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.ledger`).Scan(&n)
	return n
}

func exampleLogger() *logrus.Entry { return testLogger() }

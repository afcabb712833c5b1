// Command idemd-peers runs the peer consumers idemd-bench compares idemd's consumer with, on
// the same topic and the same database work per message (a dedup row in processed_messages
// with idemd's columns, an effect row, an outbound event):
//
//   - watermill: idiomatic Watermill. A watermill-kafka subscriber feeds a router handler
//     that runs one pgx transaction per message; the outbound event is published inside
//     that transaction through a watermill-sql publisher wrapped by the forwarder
//     component, and a Forwarder moves it from PostgreSQL to Kafka (Watermill's outbox).
//   - kafkago: a hand-written segmentio/kafka-go consumer, one reader per partition in one
//     consumer group, one transaction per message (dedup, effect, outbox row), offset
//     committed after the transaction.
//
// It is its own module so that Watermill's dependencies stay out of idemd's go.mod. It
// prints "ready" once it consumes and stops when its standard input closes (the protocol of
// idemd-bench's children). idemd-bench runs it with -peers-bin.
package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
)

type options struct {
	mode, url, schema, topic, group, outTopic string
	brokers                                   []string
	partitions, conns                         int
}

func main() {
	var o options
	var brokers string
	flag.StringVar(&o.mode, "mode", "", "watermill or kafkago")
	flag.StringVar(&o.url, "database-url", "", "PostgreSQL URL")
	flag.StringVar(&o.schema, "schema", "", "schema holding processed_messages, effects and outbox (Watermill's tables are created there)")
	flag.StringVar(&brokers, "brokers", "", "Kafka brokers, comma list")
	flag.StringVar(&o.topic, "topic", "", "topic to consume")
	flag.StringVar(&o.group, "group", "", "consumer group")
	flag.StringVar(&o.outTopic, "out-topic", "", "topic of the outbound events")
	flag.IntVar(&o.partitions, "partitions", 6, "partitions of -topic (kafkago: one reader each)")
	flag.IntVar(&o.conns, "conns", 10, "PostgreSQL connections")
	flag.Parse()
	o.brokers = strings.Split(brokers, ",")
	if err := run(o); err != nil {
		fmt.Fprintf(os.Stderr, "idemd-peers: %v\n", err)
		os.Exit(1)
	}
}

func run(o options) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, bufio.NewReader(os.Stdin))
		cancel()
	}()
	cfg, err := pgxpool.ParseConfig(o.url)
	if err != nil {
		return err
	}
	cfg.MaxConns = int32(o.conns)
	cfg.ConnConfig.RuntimeParams["search_path"] = o.schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	switch o.mode {
	case "watermill":
		return runWatermill(ctx, o, pool)
	case "kafkago":
		return runKafkaGo(ctx, o, pool)
	}
	return fmt.Errorf("-mode %q: want watermill or kafkago", o.mode)
}

const (
	dedupSQL = `INSERT INTO processed_messages (scope, message_id, fingerprint, status, received_at, completed_at, expires_at)
VALUES ($1, $2, $3, 'done', now(), now(), now() + interval '7 days') ON CONFLICT DO NOTHING`
	effectSQL = `INSERT INTO effects (message_id, payload, topic, part, off) VALUES ($1, $2::jsonb, $3, $4, $5)`
	outboxSQL = `INSERT INTO outbox (operation_id, pipeline, causation_id, topic, payload, headers)
VALUES (gen_random_uuid(), $1, $2, $3, $4, '{"content-type":"application/json"}')`
)

// claim inserts the dedup row and reports whether the id is new.
func claim(ctx context.Context, tx pgx.Tx, scope, id string, payload []byte) (bool, error) {
	fp := sha256.Sum256(payload)
	tag, err := tx.Exec(ctx, dedupSQL, scope, id, fp[:])
	return tag.RowsAffected() == 1, err
}

func runWatermill(ctx context.Context, o options, pool *pgxpool.Pool) error {
	logger := quietLogger{watermill.NewStdLogger(false, false)}
	schema := wmsql.DefaultPostgreSQLSchema{}
	const fwdTopic = "bench_forwarder"

	// The Forwarder reads the enveloped events from PostgreSQL and publishes them to Kafka.
	sqlSub, err := wmsql.NewSubscriber(wmsql.BeginnerFromPgx(pool), wmsql.SubscriberConfig{
		ConsumerGroup: o.group, SchemaAdapter: schema, OffsetsAdapter: wmsql.DefaultPostgreSQLOffsetsAdapter{},
		InitializeSchema: true,
	}, logger)
	if err != nil {
		return err
	}
	kafkaPub, err := wmkafka.NewPublisher(wmkafka.PublisherConfig{Brokers: o.brokers, Marshaler: wmkafka.DefaultMarshaler{}}, logger)
	if err != nil {
		return err
	}
	fwd, err := forwarder.NewForwarder(sqlSub, kafkaPub, logger, forwarder.Config{ForwarderTopic: fwdTopic})
	if err != nil {
		return err
	}
	errc := make(chan error, 2)
	go func() { errc <- fwd.Run(ctx) }()
	select {
	case <-fwd.Running():
	case err := <-errc:
		return fmt.Errorf("forwarder: %w", err)
	}

	saramaCfg := wmkafka.DefaultSaramaSubscriberConfig()
	saramaCfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	sub, err := wmkafka.NewSubscriber(wmkafka.SubscriberConfig{
		Brokers: o.brokers, Unmarshaler: wmkafka.DefaultMarshaler{}, OverwriteSaramaConfig: saramaCfg,
		ConsumerGroup: o.group,
	}, logger)
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return err
	}
	router.AddConsumerHandler("bench", o.topic, sub, func(msg *message.Message) error {
		mctx := msg.Context()
		id := msg.Metadata.Get("operation-id")
		if id == "" {
			return errors.New("no operation-id header")
		}
		part, _ := wmkafka.MessagePartitionFromCtx(mctx)
		off, _ := wmkafka.MessagePartitionOffsetFromCtx(mctx)
		return pgx.BeginFunc(mctx, pool, func(tx pgx.Tx) error {
			isNew, err := claim(mctx, tx, "bench", id, msg.Payload)
			if err != nil || !isNew {
				return err
			}
			if _, err := tx.Exec(mctx, effectSQL, id, string(msg.Payload), o.topic, part, off); err != nil {
				return err
			}
			// The outbox: a watermill-sql publisher on this transaction, wrapped for the
			// Forwarder.
			sqlPub, err := wmsql.NewPublisher(wmsql.TxFromPgx(tx), wmsql.PublisherConfig{SchemaAdapter: schema}, logger)
			if err != nil {
				return err
			}
			out := message.NewMessage(watermill.NewUUID(), msg.Payload)
			out.Metadata.Set("causation-id", id)
			return forwarder.NewPublisher(sqlPub, forwarder.PublisherConfig{ForwarderTopic: fwdTopic}).Publish(o.outTopic, out)
		})
	})
	go func() { errc <- router.Run(ctx) }()
	select {
	case <-router.Running():
	case err := <-errc:
		return fmt.Errorf("router: %w", err)
	}
	fmt.Println("ready")
	<-ctx.Done()
	_ = router.Close()
	_ = fwd.Close()
	return nil
}

// quietLogger keeps Watermill's errors and drops its per-handler info lines.
type quietLogger struct{ watermill.LoggerAdapter }

func (quietLogger) Info(string, watermill.LogFields)  {}
func (quietLogger) Debug(string, watermill.LogFields) {}
func (quietLogger) Trace(string, watermill.LogFields) {}
func (l quietLogger) With(f watermill.LogFields) watermill.LoggerAdapter {
	return quietLogger{l.LoggerAdapter.With(f)}
}

func runKafkaGo(ctx context.Context, o options, pool *pgxpool.Pool) error {
	var wg sync.WaitGroup
	errc := make(chan error, o.partitions)
	for range o.partitions {
		r := kafka.NewReader(kafka.ReaderConfig{
			Brokers: o.brokers, GroupID: o.group, Topic: o.topic, StartOffset: kafka.FirstOffset,
			MinBytes: 1, MaxBytes: 10 << 20, MaxWait: 100 * time.Millisecond, HeartbeatInterval: 250 * time.Millisecond,
		})
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer r.Close()
			for {
				m, err := r.FetchMessage(ctx)
				if err != nil {
					if ctx.Err() == nil {
						errc <- err
					}
					return
				}
				var id string
				for _, h := range m.Headers {
					if h.Key == "operation-id" {
						id = string(h.Value)
					}
				}
				err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					isNew, err := claim(ctx, tx, "bench", id, m.Value)
					if err != nil || !isNew {
						return err
					}
					if _, err := tx.Exec(ctx, effectSQL, id, string(m.Value), m.Topic, m.Partition, m.Offset); err != nil {
						return err
					}
					_, err = tx.Exec(ctx, outboxSQL, "bench", id, o.outTopic, m.Value)
					return err
				})
				if err == nil {
					err = r.CommitMessages(ctx, m)
				}
				if err != nil {
					if ctx.Err() == nil {
						errc <- err
					}
					return
				}
			}
		}()
	}
	fmt.Println("ready")
	select {
	case <-ctx.Done():
	case err := <-errc:
		return err
	}
	wg.Wait()
	return nil
}

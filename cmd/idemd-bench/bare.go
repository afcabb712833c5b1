package main

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemd/idemd/consumer"
	"github.com/idemd/idemd/internal/collect"
	"github.com/idemd/idemd/internal/pgarray"
	"github.com/idemd/idemd/outbox"
)

// The bare consumer is the consumer section's ceiling: the least a consumer of that load
// does on this machine, written plainly. It reads the topic as idemd's Kafka door does (a
// kafka-go consumer group, one Reader per assigned partition, the partitions dealt out to
// as many workers as the door's BatchesInFlight, the door's fetch settings and linger),
// writes each batch with the limit's unnest statement (a dedup row, an effect row and an
// outbox row per new id; a repeat writes nothing), publishes the new ids' events once
// that transaction has committed, with a kafka-go Writer set as idemd's relay's is, and
// then commits the offsets of the batch's partitions.
//
// It keeps none of idemd's promises but the dedup: the body's fingerprint is its SHA-256,
// a conflict is not told from a repeat, nothing is retried, and an event is lost if the
// process dies between its commit and its publish (nothing reads the outbox, whose rows
// stay). What it does is part of what idemd's consumer does, so its rate over the limit's
// bounds, up to the noise between runs, how close a consumer of this topic with idemd's
// client, broker and database comes to the limit here, where the broker shares the two
// cores with PostgreSQL and the consumer.
//
// With deletes set it also deletes its outbox rows once their events are published, as a
// relay that deletes what it published must: in its next batch's transaction, pipelined
// before the batch's statement (no transaction of their own), and the last batch's when
// it stops. The least a consumer whose events go through a transactional outbox does.
type bare struct {
	pool    *pgxpool.Pool
	brokers []string
	w       *kafka.Writer
	sql     string
	del     string
	batch   int
	// workers is how many workers the partitions are dealt out to, as in idemd's door.
	workers int
	topic   string // the effects' topic column: the topic read
	out     string
	// deletes removes each batch's outbox rows once published (BareDelete).
	deletes bool
	events  atomic.Int64
	txs     atomic.Int64
}

const bareScope = "bench"

// serveBare returns the bare consumer's run function and what it prints when it ends.
func serveBare(c childConfig, pool *pgxpool.Pool) (func(context.Context) error, func()) {
	b := &bare{
		pool: pool, brokers: c.Brokers,
		w: &kafka.Writer{
			Addr: kafka.TCP(c.Brokers...), Topic: c.OutboxTopic,
			Balancer: &kafka.Murmur2Balancer{}, RequiredAcks: kafka.RequireAll,
			BatchTimeout: outbox.RelayBatchTimeoutDefault, BatchBytes: 64 << 20,
			// A write holds a batch's new ids' events at most: each partition's go in one
			// produce request, with a buffer no larger than that (as the relay's Writers).
			BatchSize: c.Batch,
		},
		// The limit's statement, telling which ids were new: their events are published.
		sql:   limitSQL(quote(c.Schema), limitConfig{method: methodUnnest}) + "\nRETURNING causation_id, id",
		batch: c.Batch, workers: cmp.Or(c.InFlight, consumer.BatchesInFlightDefault), topic: c.Topic, out: c.OutboxTopic, deletes: c.BareDelete,
		del: "DELETE FROM " + quote(c.Schema) + ".outbox WHERE id = ANY($1)",
	}
	run := func(ctx context.Context) error {
		defer b.w.Close() //nolint:errcheck // every write waited for its acknowledgement
		return b.run(ctx, c.Group)
	}
	after := func() {
		fmt.Fprintf(os.Stderr, "bare child: %d transactions, %d events published\n", b.txs.Load(), b.events.Load())
	}
	return run, after
}

// run consumes the topic with group until ctx ends or a batch fails.
func (b *bare) run(ctx context.Context, group string) error {
	g, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID: group, Brokers: b.brokers, Topics: []string{b.topic},
		HeartbeatInterval: 250 * time.Millisecond, JoinGroupBackoff: 250 * time.Millisecond,
		StartOffset: kafka.FirstOffset,
	})
	if err != nil {
		return err
	}
	ctx, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	for {
		gen, err := g.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			continue
		}
		// As idemd's door deals them (consumer.Config.BatchesInFlight): with as many
		// partitions as workers or fewer, a worker each.
		parts := gen.Assignments[b.topic]
		slices.SortFunc(parts, func(x, y kafka.PartitionAssignment) int { return cmp.Compare(x.ID, y.ID) })
		for _, w := range collect.Deal(parts, b.workers) {
			gen.Start(func(gctx context.Context) {
				if err := b.partitions(gctx, gen, w); err != nil && gctx.Err() == nil {
					fail(err)
				}
			})
		}
	}
	cerr := g.Close()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return cerr
}

// partitions applies its partitions' records in batches from their assigned offsets,
// each batch in one transaction that may hold records of several of them.
func (b *bare) partitions(ctx context.Context, gen *kafka.Generation, parts []kafka.PartitionAssignment) error {
	in := make(chan kafka.Message, b.batch)
	var fetchers sync.WaitGroup
	for _, pa := range parts {
		r := kafka.NewReader(kafka.ReaderConfig{
			Brokers: b.brokers, Topic: b.topic, Partition: pa.ID,
			MinBytes: 1, MaxBytes: 10 << 20, MaxWait: consumer.FetchMaxWaitDefault + consumer.FetchAnswerMargin,
			QueueCapacity: b.batch, ReadLagInterval: -1, Dialer: consumer.FetchDialer(nil),
		})
		defer r.Close() //nolint:errcheck // a reader
		if err := r.SetOffset(pa.Offset); err != nil {
			return err
		}
		fetchers.Go(func() {
			for {
				m, err := r.FetchMessage(ctx)
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					time.Sleep(100 * time.Millisecond)
					continue
				}
				select {
				case in <- m:
				case <-ctx.Done():
					return
				}
			}
		})
	}
	go func() {
		fetchers.Wait()
		close(in)
	}()
	var s bareBatch
	offsets := map[int]int64{}
	for {
		batch, open := collect.Batch(in, b.batch, consumer.LingerDefault, s.msgs[:0])
		s.msgs = batch
		if len(batch) > 0 {
			if err := b.apply(ctx, &s); err != nil {
				return fmt.Errorf("bare consumer: %w", err)
			}
			clear(offsets)
			for _, m := range batch {
				offsets[m.Partition] = m.Offset + 1
			}
			if err := gen.CommitOffsets(map[string]map[int]int64{b.topic: offsets}); err != nil && ctx.Err() == nil {
				return fmt.Errorf("bare consumer, committing partitions' offsets %v: %w", offsets, err)
			}
		}
		if !open {
			if len(s.done) > 0 {
				if _, err := b.pool.Exec(context.WithoutCancel(ctx), b.del, s.done); err != nil {
					return fmt.Errorf("bare consumer: deleting %d published outbox rows: %w", len(s.done), err)
				}
			}
			return nil
		}
	}
}

// bareBatch is one worker's batch and its columns, reused from batch to batch.
type bareBatch struct {
	msgs   []kafka.Message
	first  map[string]int // id → its column index
	at     []int          // each column's index in msgs
	ids    []string
	fps    [][]byte
	fpBuf  []byte
	bodies [][]byte
	parts  []int32
	offs   []int64
	ops    []pgtype.UUID
	pub    []kafka.Message
	rowIDs []int64 // the outbox ids of pub
	done   []int64 // published outbox rows not deleted yet (deletes)
}

// apply writes s.msgs in one transaction, then publishes the new ids' events.
func (b *bare) apply(ctx context.Context, s *bareBatch) error {
	if s.first == nil {
		s.first = make(map[string]int, b.batch)
	}
	clear(s.first)
	s.at, s.ids, s.fps, s.bodies, s.parts, s.offs, s.ops = s.at[:0], s.ids[:0], s.fps[:0], s.bodies[:0], s.parts[:0], s.offs[:0], s.ops[:0]
	if n := sha256.Size * len(s.msgs); cap(s.fpBuf) < n {
		s.fpBuf = make([]byte, 0, n) // never grown below: s.fps point into it
	}
	s.fpBuf = s.fpBuf[:0]
	for i := range s.msgs {
		m := &s.msgs[i]
		id := string(m.Key)
		if _, seen := s.first[id]; seen {
			continue // a repeat within the batch: the limit sends first occurrences only
		}
		s.first[id] = len(s.ids)
		s.at = append(s.at, i)
		sum := sha256.Sum256(m.Value)
		at := len(s.fpBuf)
		s.fpBuf = append(s.fpBuf, sum[:]...)
		s.ids = append(s.ids, id)
		s.fps = append(s.fps, s.fpBuf[at:at+sha256.Size])
		s.bodies = append(s.bodies, m.Value)
		s.parts = append(s.parts, int32(m.Partition))
		s.offs = append(s.offs, m.Offset)
		s.ops = append(s.ops, pgtype.UUID{Bytes: outbox.OperationID(bareScope, id, 0), Valid: true})
	}
	s.pub, s.rowIDs = s.pub[:0], s.rowIDs[:0]
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		var q pgx.Batch
		if len(s.done) > 0 {
			q.Queue(b.del, s.done)
		}
		q.Queue(b.sql, bareScope, b.topic, b.out, outboxHeaders,
			pgarray.Text(s.ids), pgarray.Bytes(s.fps), pgarray.Bytes(s.bodies), s.parts, s.offs, pgarray.UUID(s.ops))
		br := tx.SendBatch(ctx, &q)
		defer br.Close() //nolint:errcheck // its errors are the results'
		if len(s.done) > 0 {
			if _, err := br.Exec(); err != nil {
				return fmt.Errorf("deleting %d published outbox rows: %w", len(s.done), err)
			}
		}
		rows, err := br.Query()
		if err != nil {
			return err
		}
		var (
			id    string
			rowID int64
		)
		_, err = pgx.ForEachRow(rows, []any{&id, &rowID}, func() error {
			s.rowIDs = append(s.rowIDs, rowID)
			j := s.first[id]
			m := &s.msgs[s.at[j]]
			s.pub = append(s.pub, kafka.Message{Value: m.Value, Headers: []kafka.Header{
				{Key: outbox.HeaderOperationID, Value: []byte(uuid.UUID(s.ops[j].Bytes).String())},
				{Key: outbox.HeaderCausationID, Value: m.Key},
				{Key: outbox.HeaderPipeline, Value: []byte(bareScope)},
			}})
			return nil
		})
		return err
	})
	if err != nil {
		return err
	}
	b.txs.Add(1)
	s.done = s.done[:0]
	if len(s.pub) == 0 {
		return nil
	}
	if err := b.w.WriteMessages(ctx, s.pub...); err != nil {
		return fmt.Errorf("publishing %d events: %w", len(s.pub), err)
	}
	b.events.Add(int64(len(s.pub)))
	if b.deletes {
		s.done = append(s.done, s.rowIDs...)
	}
	return nil
}

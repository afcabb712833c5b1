package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/kafkatest"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/outbox"
)

// handBundle is a relay bundle whose writers hand their rows over (handStore) or not
// (store).
type handBundle struct {
	*relayBundle
	handoff   *outbox.Handoff
	handStore *outbox.Store
}

func setupHandoff(t *testing.T, partitions int, opts pgtest.Options) *handBundle {
	t.Helper()
	b := setupRelay(t, partitions, opts)
	h := outbox.NewHandoff()
	return &handBundle{relayBundle: b, handoff: h, handStore: outbox.New(&outbox.Config{Schema: b.db.Schema, Handoff: h})}
}

// startRelay starts a relay with the bundle's Handoff and waits until it leads and has
// read the table once (Drain), so that it takes handed rows from then on.
func (b *handBundle) startRelay(t *testing.T, cfg outbox.RelayConfig) (*outbox.Relay, func() error) {
	t.Helper()
	cfg.Handoff = b.handoff
	r, stop := b.relayBundle.startRelay(t, cfg)
	r.TestSignals().Leading.Wait(t)
	require.NoError(t, r.Drain(context.Background()))
	return r, stop
}

// write commits events in one transaction as the unit of work does: through QueueHanded,
// then HandOver, or a NOTIFY when the rows could not be handed. It reports whether they
// were handed over.
func (b *handBundle) write(t *testing.T, events ...outbox.Event) bool {
	t.Helper()
	h := b.commit(t, events...)
	if h != nil && b.handStore.HandOver([]*outbox.Handed{h}) {
		return true
	}
	b.handStore.Notify(b.db.Pool, outbox.WakeRelay)
	return false
}

// commit writes events through QueueHanded in one transaction and commits it, without
// handing the rows over nor notifying; it returns what HandOver takes.
func (b *handBundle) commit(t *testing.T, events ...outbox.Event) *outbox.Handed {
	t.Helper()
	var h *outbox.Handed
	b.commitBatch(t, func(batch *pgx.Batch) (err error) {
		_, h, err = b.handStore.QueueHanded(batch, events...)
		return err
	})
	return h
}

// commitQuiet commits events without the Handoff and without a NOTIFY, as another process
// whose NOTIFY has not arrived yet.
func (b *handBundle) commitQuiet(t *testing.T, events ...outbox.Event) {
	t.Helper()
	b.commitBatch(t, func(batch *pgx.Batch) error {
		_, err := b.store.QueueQuiet(batch, events...)
		return err
	})
}

// commitBatch commits, in one transaction, what queue puts in a batch.
func (b *handBundle) commitBatch(t *testing.T, queue func(*pgx.Batch) error) {
	t.Helper()
	ctx := context.Background()
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	var batch pgx.Batch
	require.NoError(t, queue(&batch))
	require.NoError(t, tx.SendBatch(ctx, &batch).Close())
	require.NoError(t, tx.Commit(ctx))
}

func payloads(ms []kafka.Message) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = string(m.Value)
	}
	return out
}

// TestHandoffPublishesHandedRowsAsTheTableWould: rows handed over by their writer are
// published without being read back, once each, with the headers, key and operation id a
// row read from the table gets, and deleted from the outbox.
func TestHandoffPublishesHandedRowsAsTheTableWould(t *testing.T) {
	t.Parallel()
	b := setupHandoff(t, 1, pgtest.Options{})
	relay, _ := b.startRelay(t, outbox.RelayConfig{PollInterval: time.Minute})

	const txs, per = 20, 5
	var want []string
	for i := range txs {
		events := make([]outbox.Event, per)
		for j := range events {
			p := fmt.Sprintf("handed-%03d", i*per+j)
			want = append(want, p)
			events[j] = outbox.Event{Topic: b.topic, Key: []byte("k"), Payload: []byte(p), Pipeline: "orders",
				CausationID: fmt.Sprintf("msg-%d", i), Headers: map[string]string{"content-type": "application/json", "event-type": "x"}}
		}
		require.True(t, b.write(t, events...), "a leading relay of the process takes the rows")
	}
	records := kafkatest.ReadAll(t, b.topic, txs*per, 30*time.Second)
	require.Equal(t, want, payloads(records), "every row once, in order")
	for i, m := range records {
		require.Equal(t, "k", string(m.Key))
		require.Equal(t, outbox.OperationID("orders", fmt.Sprintf("msg-%d", i/per), i%per).String(), kafkatest.Header(m, outbox.HeaderOperationID))
		require.Equal(t, fmt.Sprintf("msg-%d", i/per), kafkatest.Header(m, outbox.HeaderCausationID))
		require.Equal(t, "orders", kafkatest.Header(m, outbox.HeaderPipeline))
		require.Equal(t, "application/json", kafkatest.Header(m, "content-type"))
		require.Equal(t, "x", kafkatest.Header(m, "event-type"))
	}
	// The last records reach Kafka before the relay commits their round and counts it;
	// Drain waits for that round to end.
	require.NoError(t, relay.Drain(context.Background()))
	require.Positive(t, relay.HandedRounds(), "the rows came from the Handoff")
	require.EqualValues(t, txs*per, relay.Published())
	require.Zero(t, b.db.Count(t, "{schema}.outbox"), "published rows are deleted")
}

// TestHandoffKeepsOrderBehindARowNotHandedOver: a row of key k committed without the
// Handoff (by another process, whose NOTIFY has not arrived), then a row of k handed over.
// The relay must not publish the handed row first: the check for older rows finds the
// older one by its id and publishes it in the same round, first, with the headers and
// operation id a row read from the table gets; with KeepPublished both are moved to
// outbox_published.
func TestHandoffKeepsOrderBehindARowNotHandedOver(t *testing.T) {
	t.Parallel()
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprintf("keep published %v", keep), func(t *testing.T) {
			t.Parallel()
			b := setupHandoff(t, 1, pgtest.Options{})
			// No poll while the test runs: only the check for older rows can find the first one.
			relay, _ := b.startRelay(t, outbox.RelayConfig{PollInterval: time.Minute, KeepPublished: keep})

			b.commitQuiet(t, outbox.Event{Topic: b.topic, Key: []byte("k"), Payload: []byte("first, elsewhere"), Pipeline: "p", CausationID: "a",
				Headers: map[string]string{"event-type": "x"}})
			require.True(t, b.write(t, outbox.Event{Topic: b.topic, Key: []byte("k"), Payload: []byte("second, handed"), Pipeline: "p", CausationID: "b"}))

			records := kafkatest.ReadAll(t, b.topic, 2, 20*time.Second)
			require.Equal(t, []string{"first, elsewhere", "second, handed"}, payloads(records))
			require.Equal(t, outbox.OperationID("p", "a", 0).String(), kafkatest.Header(records[0], outbox.HeaderOperationID))
			require.Equal(t, "a", kafkatest.Header(records[0], outbox.HeaderCausationID))
			require.Equal(t, "x", kafkatest.Header(records[0], "event-type"))
			require.NoError(t, relay.Drain(context.Background()))
			require.EqualValues(t, 1, relay.HandoffOlderTaken(), "the older row was taken by the check")
			require.Zero(t, relay.HandoffFallbacks(), "the handed row was not put back")
			require.EqualValues(t, 1, relay.HandedRows())
			require.Zero(t, b.db.Count(t, "{schema}.outbox"))
			if keep {
				require.Equal(t, 2, b.db.Count(t, "{schema}.outbox_published"))
			}
		})
	}
}

// TestHandoffFallsBackWhenOlderRowsOverflowTheRound: the rows the check for older rows
// finds, with the handed ones, would make a round larger than BatchSize, which a partition
// must take in one produce request: the transaction rolls back, the handed rows are put
// back, and a round that reads the table publishes everything in order.
func TestHandoffFallsBackWhenOlderRowsOverflowTheRound(t *testing.T) {
	t.Parallel()
	b := setupHandoff(t, 1, pgtest.Options{})
	relay, _ := b.startRelay(t, outbox.RelayConfig{PollInterval: time.Minute, BatchSize: 4})
	ev := func(p string) outbox.Event {
		return outbox.Event{Topic: b.topic, Key: []byte("k"), Payload: []byte(p), Pipeline: "p", CausationID: p}
	}
	var want []string
	for i := range 3 {
		p := fmt.Sprint("elsewhere ", i)
		want = append(want, p)
		b.commitQuiet(t, ev(p))
	}
	want = append(want, "handed 1", "handed 2")
	require.True(t, b.write(t, ev("handed 1"), ev("handed 2")))

	records := kafkatest.ReadAll(t, b.topic, 5, 20*time.Second)
	require.Equal(t, want, payloads(records))
	require.NoError(t, relay.Drain(context.Background()))
	require.EqualValues(t, 1, relay.HandoffFallbacks(), "five rows do not fit a round of four")
	require.Zero(t, relay.HandoffOlderTaken())
	require.Zero(t, b.db.Count(t, "{schema}.outbox"))
}

// TestHandoffCheckProbesTheHolesBelow: rows published and deleted by the relay, then a row
// of key k committed without the Handoff, then rows of k handed over. Below the handed
// rows, the check looks only for the ids the relay did not delete itself, one by one
// (holesBelow), rather than walking the primary key up from the floor; it still finds the
// row not handed over, and the three rows of k are published in order.
func TestHandoffCheckProbesTheHolesBelow(t *testing.T) {
	t.Parallel()
	b := setupHandoff(t, 1, pgtest.Options{})
	relay, _ := b.startRelay(t, outbox.RelayConfig{PollInterval: time.Minute})
	ev := func(key, p string) outbox.Event {
		return outbox.Event{Topic: b.topic, Key: []byte(key), Payload: []byte(p), Pipeline: "p", CausationID: p}
	}
	for i := range 30 {
		require.True(t, b.write(t, ev("before", fmt.Sprint("before ", i))))
	}
	require.Eventually(t, func() bool { return relay.Published() == 30 }, 20*time.Second, 10*time.Millisecond)
	require.Zero(t, relay.HandoffBelowWalks(), "every check so far probed the holes")
	probed := relay.HandoffBelowProbes()

	b.commitQuiet(t, ev("k", "k elsewhere"))
	require.True(t, b.write(t, ev("k", "k handed 1"), ev("k", "k handed 2")))
	want := []string{"k elsewhere", "k handed 1", "k handed 2"}
	var got []string
	for _, m := range kafkatest.ReadAll(t, b.topic, 33, 20*time.Second) {
		if string(m.Key) == "k" {
			got = append(got, string(m.Value))
		}
	}
	require.Equal(t, want, got)
	require.NoError(t, relay.Drain(context.Background()))
	require.EqualValues(t, 1, relay.HandoffOlderTaken(), "the probe found the row not handed over and took it")
	require.Zero(t, relay.HandoffFallbacks())
	require.Zero(t, relay.HandoffBelowWalks())
	require.Greater(t, relay.HandoffBelowProbes(), probed, "the row not handed over was a hole, looked for by its id")
}

// TestHandoffKeepsOrderAroundARowNotHandedOver: rows of key k written one after another,
// the first and the third handed over together, the second not. The check finds the one
// between them, and the three are published in order.
func TestHandoffKeepsOrderAroundARowNotHandedOver(t *testing.T) {
	t.Parallel()
	b := setupHandoff(t, 1, pgtest.Options{})
	relay, _ := b.startRelay(t, outbox.RelayConfig{PollInterval: time.Minute})

	ev := func(p string) outbox.Event {
		return outbox.Event{Topic: b.topic, Key: []byte("k"), Payload: []byte(p), Pipeline: "p", CausationID: p}
	}
	first := b.commit(t, ev("first"))
	b.commitQuiet(t, ev("second, elsewhere"))
	third := b.commit(t, ev("third"))
	require.True(t, b.handStore.HandOver([]*outbox.Handed{first, third}))

	records := kafkatest.ReadAll(t, b.topic, 3, 20*time.Second)
	require.Equal(t, []string{"first", "second, elsewhere", "third"}, payloads(records))
	require.NoError(t, relay.Drain(context.Background()))
	require.EqualValues(t, 1, relay.HandoffOlderTaken(), "the row between them was taken by the check")
	require.Zero(t, relay.HandoffFallbacks())
}

// TestHandoffCheckSkipsRowsItPublished: one transaction's rows have ids around another's,
// written meanwhile. Between its rows, the check for older rows looks for the ids that may
// still hold an unpublished row (one in flight), not for those of rows the relay deleted
// already: ids are never used twice.
func TestHandoffCheckSkipsRowsItPublished(t *testing.T) {
	t.Parallel()
	b := setupHandoff(t, 1, pgtest.Options{})
	relay, _ := b.startRelay(t, outbox.RelayConfig{PollInterval: time.Minute})
	ctx := context.Background()
	ev := func(p string) outbox.Event {
		return outbox.Event{Topic: b.topic, Key: []byte(p), Payload: []byte(p), Pipeline: "p", CausationID: p}
	}
	// queue sends events in tx, through the Handoff's Store, and returns what HandOver takes.
	queue := func(tx pgx.Tx, p string) *outbox.Handed {
		var batch pgx.Batch
		_, h, err := b.handStore.QueueHanded(&batch, ev(p))
		require.NoError(t, err)
		require.NoError(t, tx.SendBatch(ctx, &batch).Close())
		require.NotNil(t, h)
		return h
	}
	long, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer long.Rollback(ctx) //nolint:errcheck // after Commit
	late, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer late.Rollback(ctx) //nolint:errcheck // after Commit

	first := queue(long, "long 1")                         // id n
	require.True(t, b.write(t, ev("published meanwhile"))) // n+1, committed and handed over
	require.Eventually(t, func() bool { return relay.Published() == 1 }, 20*time.Second, 10*time.Millisecond)
	lateRow := queue(late, "in flight") // n+2, not committed yet
	second := queue(long, "long 2")     // n+3
	require.NoError(t, long.Commit(ctx))
	require.True(t, b.handStore.HandOver([]*outbox.Handed{first, second}))
	require.Eventually(t, func() bool { return relay.Published() == 3 }, 20*time.Second, 10*time.Millisecond)
	require.EqualValues(t, 1, relay.HandoffGapProbes(), "n+2 is looked for; n+1, which the relay deleted, is not")
	require.Zero(t, relay.HandoffFallbacks())

	require.NoError(t, late.Commit(ctx))
	require.True(t, b.handStore.HandOver([]*outbox.Handed{lateRow}))
	records := kafkatest.ReadAll(t, b.topic, 4, 20*time.Second)
	require.Equal(t, []string{"published meanwhile", "long 1", "long 2", "in flight"}, payloads(records))
	// The last record reaches Kafka before the relay commits its round and counts it.
	require.Eventually(t, func() bool { return relay.HandedRounds() == 3 }, 10*time.Second, time.Millisecond,
		"every row was handed over")
	require.EqualValues(t, 4, relay.HandedRows())
}

// TestHandoffDropsRowsPublishedFromTheTable: rows published by a round that read the table
// before their handed copy came up are not published again.
func TestHandoffDropsRowsPublishedFromTheTable(t *testing.T) {
	t.Parallel()
	b := setupHandoff(t, 1, pgtest.Options{})
	relay, _ := b.startRelay(t, outbox.RelayConfig{PollInterval: time.Minute})

	h := b.commit(t, b.events(10, "both")...)
	require.NotNil(t, h)
	require.NoError(t, relay.Drain(context.Background()), "a round reads the table and publishes them")
	require.True(t, b.handStore.HandOver([]*outbox.Handed{h}), "then their writer hands them over")
	// The row written after is taken after the handed copies were.
	require.True(t, b.write(t, b.events(1, "after")...))
	records := kafkatest.ReadAtLeastFrom(t, kafkatest.Brokers(t), b.topic, 11, 20*time.Second, time.Second)
	require.Len(t, records, 11, "each row once: %v", payloads(records))
	require.EqualValues(t, 11, relay.Published())
}

// TestHandoffCrashBetweenPublishAndCommit: the relay dies after the broker acknowledged
// handed rows and before the transaction that deletes them committed. The rows are still
// in the outbox, and the next leader publishes them again with the same operation ids.
func TestHandoffCrashBetweenPublishAndCommit(t *testing.T) {
	t.Parallel()
	b := setupHandoff(t, 1, pgtest.Options{})
	crashed := errors.New("simulated crash after publish")
	hit := make(chan struct{})
	_, stop := b.startRelay(t, outbox.RelayConfig{PollInterval: time.Minute, AfterPublish: func([]int64) error {
		close(hit)
		return crashed
	}})
	require.True(t, b.write(t, b.events(20, "crash")...))
	select {
	case <-hit:
	case <-time.After(30 * time.Second):
		t.Fatal("the relay never published the handed rows")
	}
	require.ErrorIs(t, stop(), crashed)
	require.Equal(t, 20, b.db.Count(t, "{schema}.outbox WHERE published_at IS NULL"), "the rows stay")

	second, _ := b.relayBundle.startRelay(t, outbox.RelayConfig{})
	b.drain(t, second, 30*time.Second)
	records := kafkatest.ReadAll(t, b.topic, 40, 30*time.Second)
	require.Len(t, records, 40, "published twice")
	require.Len(t, sameOperationIDs(t, records), 20)
}

// TestHandoffWithoutALeadingRelay: with no relay of the process leading, a Store asks for
// no ids and HandOver refuses, so that the writer notifies the relay wherever it leads.
func TestHandoffWithoutALeadingRelay(t *testing.T) {
	t.Parallel()
	b := setupHandoff(t, 1, pgtest.Options{})
	require.Nil(t, b.commit(t, b.events(3, "alone")...), "no relay leads: no ids are asked for")
	require.False(t, b.write(t, b.events(3, "alone-2")...))

	relay, stop := b.startRelay(t, outbox.RelayConfig{})
	require.EqualValues(t, 6, relay.Published(), "the rows were read from the table")
	require.NoError(t, stop())
	h := outbox.NewHandoff()
	other := outbox.New(&outbox.Config{Schema: b.db.Schema, Handoff: h})
	var batch pgx.Batch
	_, handed, err := other.QueueHanded(&batch, b.events(1, "x")...)
	require.NoError(t, err)
	require.Nil(t, handed, "a Handoff no relay uses")
	require.False(t, b.handStore.HandOver([]*outbox.Handed{{}}), "a relay that stopped takes nothing")
}

// TestHandoffPublishesEveryCommittedRowInOrder: concurrent writers, half of them handing
// their rows over and half writing as other processes do (a NOTIFY at commit), some
// committing late and some rolling back. Every committed row is published, no rolled-back
// row is, and each writer's rows keep their order.
//
// Whether a round takes handed rows depends on timing: each NOTIFY sends the relay to the
// table, and a relay slower than the writers reads the table until they stop (on a loaded
// machine, under -race, a run had none). The run is repeated, each time checked in full,
// until one took handed rows, so that the mix is known to have gone through both paths.
func TestHandoffPublishesEveryCommittedRowInOrder(t *testing.T) {
	t.Parallel()
	const attempts = 5
	for attempt := 1; ; attempt++ {
		handed := publishMixedWriters(t)
		if handed > 0 {
			return
		}
		require.Less(t, attempt, attempts, "no round took handed rows in %d runs", attempts)
	}
}

// publishMixedWriters runs TestHandoffPublishesEveryCommittedRowInOrder's writers once, on
// a schema of its own, checks what the relay published and returns how many of its rounds
// took handed rows.
func publishMixedWriters(t *testing.T) int64 {
	const writers = 8
	b := setupHandoff(t, 4, pgtest.Options{MaxConns: writers + 3})
	relay, stop := b.startRelay(t, outbox.RelayConfig{BatchSize: 200, PollInterval: 200 * time.Millisecond})
	defer stop() //nolint:errcheck // the run's outcome is checked below
	o := b.writeConcurrently(t, writers, 600, 8, func(w int, batch *pgx.Batch, events []outbox.Event) (func(), error) {
		if w%2 == 1 {
			return nil, b.store.Queue(batch, events...)
		}
		_, h, err := b.handStore.QueueHanded(batch, events...)
		return func() {
			if h == nil || !b.handStore.HandOver([]*outbox.Handed{h}) {
				b.handStore.Notify(b.db.Pool, outbox.WakeRelay)
			}
		}, err
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	require.NoError(t, relay.Drain(ctx))
	require.Zero(t, b.db.Count(t, "{schema}.outbox"), "Drain returned with rows left")
	o.checkPublished(t, kafkatest.ReadAll(t, b.topic, len(o.committed), 60*time.Second))
	t.Logf("%d rows, %d rounds, %d of them handed over, %d older rows taken with them, %d handovers put back",
		len(o.committed), relay.Rounds(), relay.HandedRounds(), relay.HandoffOlderTaken(), relay.HandoffFallbacks())
	return relay.HandedRounds()
}

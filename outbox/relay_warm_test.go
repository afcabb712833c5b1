package outbox_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemd/idemd/internal/kafkatest"
	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/internal/sqstest"
	"github.com/idemd/idemd/outbox"
)

// countingListener counts the connections a broker accepted and, when open is set, those
// still open (the broker closes its side when the client closes its).
type countingListener struct {
	net.Listener
	accepted *atomic.Int64
	open     *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
		if l.open != nil {
			l.open.Add(1)
			c = &countedConn{Conn: c, open: l.open}
		}
	}
	return c, err
}

type countedConn struct {
	net.Conn
	open *atomic.Int64
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.open.Add(-1) })
	return c.Conn.Close()
}

// TestRelayWarmsItsKafkaConnectionsWhenItLeads: a relay that takes the leadership of an
// empty outbox, with the default writer (on a kafka-go Transport of its own), reads the metadata
// and reaches the partition's leader before any row is written; its first publish then
// finds its connection open and dials none.
func TestRelayWarmsItsKafkaConnectionsWhenItLeads(t *testing.T) {
	t.Parallel()
	// The relay's own broker: the shared one is already known to DefaultTransport (kafkatest
	// creates topics through it), so it would be warm whatever the relay did.
	topic := kafkatest.Name(t, "warm")
	var accepted atomic.Int64
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic),
		kfake.ListenFn(func(network, address string) (net.Listener, error) {
			l, err := net.Listen(network, address)
			if err != nil {
				return nil, err
			}
			return countingListener{Listener: l, accepted: &accepted}, nil
		}))
	require.NoError(t, err)
	t.Cleanup(cluster.Close)
	var (
		mu   sync.Mutex
		seen = map[string]int{} // requests the broker received, by kind
	)
	for _, key := range []kmsg.Key{kmsg.Metadata, kmsg.ListOffsets, kmsg.Produce} {
		cluster.ControlKey(int16(key), func(kmsg.Request) (kmsg.Response, error, bool) {
			mu.Lock()
			seen[key.Name()]++
			mu.Unlock()
			return nil, nil, false // observed, then handled by the broker
		})
	}
	requests := func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		return map[string]int{"Metadata": seen["Metadata"], "ListOffsets": seen["ListOffsets"], "Produce": seen["Produce"]}
	}

	db := pgtest.New(t)
	b := &relayBundle{db: db, store: outbox.New(&outbox.Config{Schema: db.Schema}), topic: topic}
	r, _ := b.startRelay(t, outbox.RelayConfig{Brokers: cluster.ListenAddrs()},
		func(s *outbox.RelaySignals) { s.Warmed.Init(t); s.Round.Init(t) })
	r.TestSignals().Leading.Wait(t)
	require.NoError(t, r.TestSignals().Warmed.Wait(t))

	require.Zero(t, db.Count(t, "{schema}.outbox"), "no row was written yet")
	got := requests()
	require.Positive(t, got["Metadata"], "the relay read the metadata as it took the leadership")
	require.Equal(t, 1, got["ListOffsets"], "the relay reached the partition's leader")
	require.Zero(t, got["Produce"])
	conns := accepted.Load()
	require.EqualValues(t, 2, conns, "one connection for the metadata, one to the partition's leader")

	b.enqueue(t, b.events(5, "warm")...)
	r.TestSignals().Round.WaitFor(t, "the first publish", func(rd outbox.RelayRound) bool { return rd.Published > 0 })
	require.Positive(t, requests()["Produce"])
	require.Equal(t, conns, accepted.Load(), "the first publish used the connection opened when the relay took the leadership")
}

// TestRelayWarmUpDoesNotHoldItsRounds: the relay's Kafka broker accepts connections and
// never answers. The warm-up that follows the leadership waits in that broker, while the
// relay's rounds publish the rows bound for SQS; the warm-up ends, with its context's
// error, when the relay stops. The writer is the user's *kafka.Writer, warmed like the
// default one.
func TestRelayWarmUpDoesNotHoldItsRounds(t *testing.T) {
	t.Parallel()
	hole, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var (
		mu    sync.Mutex
		held  []net.Conn
		dialt = make(chan struct{}, 1)
	)
	go func() {
		for {
			c, err := hole.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
			select {
			case dialt <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		_ = hole.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			_ = c.Close()
		}
	})
	// No dial timeout of the transport's to end the warm-up early: only the relay does.
	tr := &kafka.Transport{DialTimeout: time.Hour}
	t.Cleanup(tr.CloseIdleConnections)
	w := &kafka.Writer{Addr: kafka.TCP(hole.Addr().String()), Transport: tr, MaxAttempts: 1}
	p, err := outbox.NewSQSPublisher(sqstest.Client(t))
	require.NoError(t, err)

	db := pgtest.New(t)
	b := &relayBundle{db: db, store: outbox.New(&outbox.Config{Schema: db.Schema}), topic: outbox.SQSDestination(sqstest.Queue(t, nil))}
	r, stop := b.startRelay(t, outbox.RelayConfig{Writer: w, SQS: p},
		func(s *outbox.RelaySignals) { s.Warmed.Init(t); s.Round.Init(t) })
	r.TestSignals().Leading.Wait(t)
	select {
	case <-dialt:
	case <-time.After(30 * time.Second):
		t.Fatal("the relay did not connect to its Kafka broker")
	}

	b.enqueue(t, b.events(10, "sqs")...)
	rd := r.TestSignals().Round.WaitFor(t, "a round that published", func(rd outbox.RelayRound) bool { return rd.Published > 0 })
	require.Equal(t, 10, rd.Published)
	select {
	case err := <-r.TestSignals().Warmed.C():
		t.Fatalf("the warm-up ended (%v) before the relay's rounds went on", err)
	default:
	}
	require.True(t, r.IsLeader())

	require.NoError(t, stop())
	require.ErrorIs(t, r.TestSignals().Warmed.Wait(t), context.Canceled)
}

// TestRelayClosesItsKafkaConnectionsWhenItStops: a relay that published and then stopped
// leaves no connection open to its broker. Its writer's transport is its own; on kafka-go's
// DefaultTransport, shared by the process, the metadata connection and the idle one to the
// partition's leader stayed open (with the pool's goroutine) until the process exited.
func TestRelayClosesItsKafkaConnectionsWhenItStops(t *testing.T) {
	t.Parallel()
	topic := kafkatest.Name(t, "close")
	var accepted, open atomic.Int64
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic),
		kfake.ListenFn(func(network, address string) (net.Listener, error) {
			l, err := net.Listen(network, address)
			if err != nil {
				return nil, err
			}
			return countingListener{Listener: l, accepted: &accepted, open: &open}, nil
		}))
	require.NoError(t, err)
	t.Cleanup(cluster.Close)

	db := pgtest.New(t)
	b := &relayBundle{db: db, store: outbox.New(&outbox.Config{Schema: db.Schema}), topic: topic}
	r, stop := b.startRelay(t, outbox.RelayConfig{Brokers: cluster.ListenAddrs()},
		func(s *outbox.RelaySignals) { s.Round.Init(t) })
	r.TestSignals().Leading.Wait(t)
	b.enqueue(t, b.events(3, "close")...)
	r.TestSignals().Round.WaitFor(t, "the publish", func(rd outbox.RelayRound) bool { return rd.Published > 0 })
	require.Positive(t, open.Load(), "the relay's connections are open while it runs")

	require.NoError(t, stop())
	require.Eventually(t, func() bool { return open.Load() == 0 }, 5*time.Second, 10*time.Millisecond,
		"connections still open after the relay stopped: %d of %d", open.Load(), accepted.Load())
}

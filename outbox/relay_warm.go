package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
)

// relayWarmTimeout bounds the warm-up of the Kafka writer's connections (warmWriter).
const relayWarmTimeout = 10 * time.Second

// warmWriter opens, in the background, the Kafka connections the relay's first publish
// would otherwise wait for, and returns a function that stops the warm-up and waits for it.
//
// kafka-go's Writer connects lazily, through its Transport (kafka.DefaultTransport when
// Writer.Transport is nil): the first WriteMessages creates the transport's pool for
// Writer.Addr, whose goroutine dials the bootstrap broker and reads the metadata of every
// topic, and then the produce to each partition leader dials that broker and negotiates
// its API versions. The pool is the transport's, keyed by the address, so a kafka.Client
// with the writer's Addr and Transport shares it: its Metadata request waits for the same
// first metadata (and is then served from the pool's cache), and a ListOffsets request,
// which the transport routes to the partition's leader like a produce, leaves an idle
// connection to that leader that the writer's first produce takes instead of dialling.
//
// It warms one connection to each broker that leads a partition of a topic that is not
// internal: the outbox names no topic before its rows are written (after a fresh start it
// is empty), and the metadata of every topic is what the transport reads anyway. The
// transport gives a request in flight a connection of its own, so a first round that
// writes to several partitions of one broker at once still opens the others then, in
// parallel. The transport closes idle connections after its IdleTimeout (30 s by default):
// a first publish later than that dials again.
//
// It runs beside the relay's rounds and never delays them: a broker that is slow or down
// only makes it fail, after relayWarmTimeout at most, and the failure is logged at info
// level. It does nothing when RelayConfig.Writer is not a *kafka.Writer.
func (r *Relay) warmWriter(ctx context.Context) (stop func()) {
	w := r.kafkaWriter()
	if w == nil || w.Addr == nil {
		return func() {}
	}
	ctx, cancel := context.WithTimeout(ctx, relayWarmTimeout)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer cancel()
		start := time.Now()
		brokers, err := warmKafka(ctx, &kafka.Client{Addr: w.Addr, Transport: w.Transport})
		log := r.log.WithField("count", brokers).WithField("duration", time.Since(start).Seconds())
		switch {
		case err == nil:
			log.Debug("relay opened its Kafka connections")
		case !errors.Is(err, context.Canceled):
			log.WithError(err).Info("relay could not open its Kafka connections ahead of its first publish; that publish opens them")
		}
		r.signals.Warmed.Signal(err)
	}()
	return func() {
		cancel()
		<-done
	}
}

// warmKafka reads the cluster's metadata through cl and sends one ListOffsets request to
// each broker that leads a partition of a topic that is not internal, all at once. It
// returns how many brokers answered.
func warmKafka(ctx context.Context, cl *kafka.Client) (int, error) {
	md, err := cl.Metadata(ctx, &kafka.MetadataRequest{})
	if err != nil {
		return 0, fmt.Errorf("error reading the Kafka metadata: %w", err)
	}
	led := map[int]kafka.Partition{} // a partition of each leader
	for _, t := range md.Topics {
		if t.Internal || t.Error != nil {
			continue
		}
		for _, p := range t.Partitions {
			// A leader the metadata does not list is kafka-go's zero Broker, without a host.
			if _, ok := led[p.Leader.ID]; !ok && p.Leader.Host != "" && p.Error == nil {
				led[p.Leader.ID] = p
			}
		}
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for _, p := range led {
		wg.Go(func() {
			_, err := cl.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{
				p.Topic: {kafka.FirstOffsetOf(p.ID)},
			}})
			if err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("error reaching broker %d: %w", p.Leader.ID, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return len(led) - len(errs), errors.Join(errs...)
}

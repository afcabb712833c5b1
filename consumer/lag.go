package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/sirupsen/logrus"

	"github.com/idemd/idemd/internal/metrics"
)

// LagIntervalDefault is how often a LagMonitor reads the lag unless told otherwise.
const LagIntervalDefault = 15 * time.Second

// LagConfig configures a LagMonitor.
type LagConfig struct {
	// Name is the subscription's pipeline: the pipeline label of the series. Required.
	Name string
	// Brokers are the Kafka bootstrap addresses. Required.
	Brokers []string
	// Topics are the subscription's topics. Required.
	Topics []string
	// Group is the subscription's consumer group. Defaults to "idemd-" + Name, the
	// consumer's default.
	Group string
	// Interval is how often the lag is read. Defaults to 15 s.
	Interval time.Duration
	// Owned, when set, restricts the series to the partitions it reports true for (those
	// this process's consumer holds), so that a plain sum over replicas is the group's
	// lag. Defaults to every partition of Topics: each replica reports the whole group,
	// and dashboards aggregate with max by (pipeline, topic, partition).
	Owned func(topic string, partition int) bool
	// Logger receives the monitor's warnings. Defaults to logrus's standard logger.
	Logger *logrus.Entry
}

// LagMonitor exports idemd_consumer_lag for one subscription, measured the way Kafka's own
// tools measure it: the group's committed offset, as the broker stores it, against each
// partition's high-water mark. A consumer that is stuck (alive but committing nothing) or
// gone therefore shows a lag that grows with every record produced, which the offset of
// the last batch a consumer handled cannot show. A partition without a committed offset
// counts every record still in the log, since the consumer starts from the first offset.
//
// Series of partitions the broker no longer reports (a deleted topic, a partition no
// longer Owned) are deleted at the next read, and all of the monitor's series when Run
// returns, so that nothing stale stays exported.
type LagMonitor struct {
	cfg    LagConfig
	client *kafka.Client
	log    *logrus.Entry
	// exported are the (topic, partition) label pairs this monitor has set.
	exported map[[2]string]bool
}

// NewLagMonitor returns a monitor of cfg's subscription; call Run, or Poll.
func NewLagMonitor(cfg *LagConfig) (*LagMonitor, error) {
	c := *cfg
	c.Group = cmp.Or(c.Group, GroupPrefix+c.Name)
	c.Interval = cmp.Or(c.Interval, LagIntervalDefault)
	switch {
	case c.Name == "":
		return nil, errors.New("consumer: LagConfig.Name is required")
	case len(c.Brokers) == 0:
		return nil, errors.New("consumer: LagConfig.Brokers is required")
	case len(c.Topics) == 0:
		return nil, errors.New("consumer: LagConfig.Topics is required")
	}
	if c.Logger == nil {
		c.Logger = logrus.NewEntry(logrus.StandardLogger())
	}
	return &LagMonitor{
		cfg:      c,
		client:   &kafka.Client{Addr: kafka.TCP(c.Brokers...), Timeout: 10 * time.Second},
		log:      c.Logger.WithField("component", "consumer").WithField("pipeline", c.Name),
		exported: map[[2]string]bool{},
	}, nil
}

// Run reads the lag every Interval until ctx ends, then deletes the monitor's series. A
// failed read is counted (idemd_consumer_lag_errors_total) and logged once until a read
// succeeds again; the values of the last good read stay exported meanwhile.
func (m *LagMonitor) Run(ctx context.Context) error {
	defer m.forget()
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	failing := false
	for {
		_, err := m.Poll(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil && !failing:
			m.log.WithError(err).Warn("error reading the consumer lag from the brokers; retrying")
		case err == nil && failing:
			m.log.Info("consumer lag readable again")
		}
		failing = err != nil
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Poll reads the lag once, updates the series and returns the lag per topic and partition.
func (m *LagMonitor) Poll(ctx context.Context) (map[string]map[int]int64, error) {
	lag, err := m.read(ctx)
	if err != nil {
		metrics.ConsumerLagErrors.WithLabelValues(m.cfg.Name).Inc()
		return nil, err
	}
	seen := map[[2]string]bool{}
	for topic, parts := range lag {
		for p, n := range parts {
			k := [2]string{topic, strconv.Itoa(p)}
			seen[k] = true
			metrics.ConsumerLag.WithLabelValues(m.cfg.Name, k[0], k[1]).Set(float64(n))
		}
	}
	for k := range m.exported {
		if !seen[k] {
			metrics.ConsumerLag.DeleteLabelValues(m.cfg.Name, k[0], k[1])
		}
	}
	m.exported = seen
	return lag, nil
}

func (m *LagMonitor) forget() {
	for k := range m.exported {
		metrics.ConsumerLag.DeleteLabelValues(m.cfg.Name, k[0], k[1])
	}
	m.exported = map[[2]string]bool{}
}

// read asks the brokers for the partitions of the topics, their first and last offsets,
// and the group's committed offsets.
func (m *LagMonitor) read(ctx context.Context) (map[string]map[int]int64, error) {
	md, err := m.client.Metadata(ctx, &kafka.MetadataRequest{Topics: m.cfg.Topics})
	if err != nil {
		return nil, fmt.Errorf("error reading topic metadata: %w", err)
	}
	partitions := map[string][]int{}
	offsets := map[string][]kafka.OffsetRequest{}
	for _, t := range md.Topics {
		if t.Error != nil {
			continue // a topic that does not exist (any more) has no lag to report
		}
		for _, p := range t.Partitions {
			if m.cfg.Owned != nil && !m.cfg.Owned(t.Name, p.ID) {
				continue
			}
			partitions[t.Name] = append(partitions[t.Name], p.ID)
			offsets[t.Name] = append(offsets[t.Name], kafka.FirstOffsetOf(p.ID), kafka.LastOffsetOf(p.ID))
		}
	}
	lag := map[string]map[int]int64{}
	if len(partitions) == 0 {
		return lag, nil
	}
	ends, err := m.client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: offsets})
	if err != nil {
		return nil, fmt.Errorf("error reading the partitions' offsets: %w", err)
	}
	committed, err := m.client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: m.cfg.Group, Topics: partitions})
	if err != nil {
		return nil, fmt.Errorf("error reading the offsets of group %s: %w", m.cfg.Group, err)
	}
	if committed.Error != nil && !errors.Is(committed.Error, kafka.GroupIdNotFound) {
		// A group that never joined has committed nothing (some brokers say so with this
		// error, Kafka with offsets of -1).
		return nil, fmt.Errorf("error reading the offsets of group %s: %w", m.cfg.Group, committed.Error)
	}
	commit := map[string]map[int]int64{}
	for topic, ps := range committed.Topics {
		commit[topic] = map[int]int64{}
		for _, p := range ps {
			if p.Error != nil {
				return nil, fmt.Errorf("error reading the offset of group %s on %s/%d: %w", m.cfg.Group, topic, p.Partition, p.Error)
			}
			commit[topic][p.Partition] = p.CommittedOffset
		}
	}
	for topic, ps := range ends.Topics {
		for _, p := range ps {
			if p.Error != nil {
				return nil, fmt.Errorf("error reading the offsets of %s/%d: %w", topic, p.Partition, p.Error)
			}
			// Without a committed offset the consumer starts at the first offset.
			from, ok := commit[topic][p.Partition]
			if !ok || from < 0 {
				from = p.FirstOffset
			}
			if lag[topic] == nil {
				lag[topic] = map[int]int64{}
			}
			lag[topic][p.Partition] = max(p.LastOffset-from, 0)
		}
	}
	return lag, nil
}

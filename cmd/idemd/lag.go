package main

import (
	"context"
	"fmt"

	"github.com/idemd/idemd/consumer"
)

// startLagMonitors starts one consumer.LagMonitor per subscription: the lag series come
// from the brokers' committed group offsets, for the partitions this process holds (so a
// sum over replicas counts each partition once, and a rebalance moves the series), and stop
// with the consumers.
func (d *daemon) startLagMonitors(start starter, consumers []*consumer.Consumer) error {
	for _, c := range consumers {
		cfg := c.Config()
		if cfg.Door() != consumer.DoorKafka {
			continue // a Pub/Sub or SQS subscription exports its own backlog, where the broker tells it
		}
		m, err := consumer.NewLagMonitor(&consumer.LagConfig{
			Name: cfg.Name, Brokers: d.cfg.Brokers, Topics: cfg.Topics, Group: cfg.Group, Logger: d.cfg.Logger,
			Owned: c.Owns,
		})
		if err != nil {
			return fmt.Errorf("error starting the lag monitor of subscription %q: %w", cfg.Name, err)
		}
		mctx, cancel := context.WithCancel(context.Background())
		p := &part{role: roleConsumer, name: fmt.Sprintf("the lag monitor of subscription %q", cfg.Name)}
		p.stop = func(ctx context.Context) error { return p.cancelAndWait(ctx, cancel) }
		start(p, func(context.Context) error { return m.Run(mctx) })
	}
	return nil
}

package main

import (
	"cmp"
	"context"
	"errors"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/admin"
	"github.com/idemd/idemd/consumer"
)

// newAdmin builds the admin server of the daemon (package admin): it starts before the
// migrations, so that a probe can tell "alive but not ready" from "dead".
// running is the daemon's running consumers, whose SQS backlog the console shows.
func newAdmin(c *daemonConfig, pool *pgxpool.Pool, running *runningConsumers) (*admin.Server, error) {
	cfg := &admin.Config{
		Schema: c.Schema, Tokens: c.AdminTokens, InsecureReads: c.AdminInsecureReads,
		OutboxKeepsPublished: c.OutboxKeepPublished, Logger: c.Logger,
	}
	cfg.Sources = c.Pipelines.Receiver().Sources
	if subs := c.Pipelines.Consumers(); len(subs) > 0 {
		kc := &admin.KafkaConsumers{Pool: pool, Schema: c.Schema, Brokers: c.Brokers}
		for _, s := range subs {
			switch s.Door() {
			case consumer.DoorKafka:
				kc.Subscriptions = append(kc.Subscriptions, admin.KafkaSubscription{
					Pipeline: s.Name, Group: cmp.Or(s.Group, consumer.GroupPrefix+s.Name), Topics: s.Topics,
				})
			case consumer.DoorPubSub:
				kc.Brokered = append(kc.Brokered, admin.BrokerSubscription{Pipeline: s.Name, Door: s.Door(), Subscription: s.PubSub.Subscription})
			case consumer.DoorSQS:
				kc.Brokered = append(kc.Brokered, admin.BrokerSubscription{
					Pipeline: s.Name, Door: s.Door(), Subscription: s.SQS.Queue, Backlog: running.backlog(s.Name),
				})
			}
		}
		cfg.Consumers = kc
	}
	if c.NewReplayer != nil {
		cfg.Replayer = c.NewReplayer(pool)
	}
	return admin.New(pool, cfg)
}

// runningConsumers are the consumers this process runs, by pipeline (filled by
// startConsumers).
type runningConsumers struct {
	mu sync.Mutex
	m  map[string]*consumer.Consumer
}

func (r *runningConsumers) add(c *consumer.Consumer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[string]*consumer.Consumer{}
	}
	r.m[c.Name()] = c
}

// backlog reads the backlog of pipeline's subscription through its running consumer.
func (r *runningConsumers) backlog(pipeline string) func(ctx context.Context) (int64, error) {
	return func(ctx context.Context) (int64, error) {
		r.mu.Lock()
		c := r.m[pipeline]
		r.mu.Unlock()
		if c == nil {
			return 0, errors.New("this process does not run the subscription (role consumer)")
		}
		return c.Backlog(ctx)
	}
}

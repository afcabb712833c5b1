package main

import (
	"cmp"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemd/idemd/admin"
	"github.com/idemd/idemd/consumer"
)

// newAdmin builds the admin server of the daemon (package admin): it starts before the
// migrations, so that a probe can tell "alive but not ready" from "dead".
func newAdmin(c *daemonConfig, pool *pgxpool.Pool) (*admin.Server, error) {
	cfg := &admin.Config{
		Schema: c.Schema, Tokens: c.AdminTokens, InsecureReads: c.AdminInsecureReads,
		OutboxKeepsPublished: c.OutboxKeepPublished, Logger: c.Logger,
	}
	cfg.Sources = c.Pipelines.Receiver().Sources
	if subs := c.Pipelines.Consumers(); len(subs) > 0 {
		kc := &admin.KafkaConsumers{Pool: pool, Schema: c.Schema, Brokers: c.Brokers}
		for _, s := range subs {
			kc.Subscriptions = append(kc.Subscriptions, admin.KafkaSubscription{
				Pipeline: s.Name, Group: cmp.Or(s.Group, consumer.GroupPrefix+s.Name), Topics: s.Topics,
			})
		}
		cfg.Consumers = kc
	}
	if c.NewReplayer != nil {
		cfg.Replayer = c.NewReplayer(pool)
	}
	return admin.New(pool, cfg)
}

package main

import (
	"context"
	"fmt"

	"github.com/idemd/idemd/delivery"
)

// startDeliverer runs the outbound HTTP sink (publish.http) as part of the relay role: both
// move committed outbox events out of the database, one to Kafka, the other by POST. It
// starts nothing when no pipeline publishes by HTTP.
func (d *daemon) startDeliverer(start starter) error {
	endpoints := d.cfg.Pipelines.DeliveryEndpoints()
	if len(endpoints) == 0 {
		return nil
	}
	dl, err := delivery.NewDeliverer(d.pool, &delivery.Config{
		Schema:         d.cfg.Schema,
		Endpoints:      endpoints,
		Logger:         d.cfg.Logger.WithField("component", "delivery"),
		TracerProvider: d.cfg.TracerProvider,
	})
	if err != nil {
		return fmt.Errorf("error starting the HTTP deliverer: %w", err)
	}
	dctx, cancel := context.WithCancel(context.Background())
	p := &part{role: roleRelay, name: "the HTTP deliverer"}
	p.stop = func(ctx context.Context) error {
		// Attempts in flight end with ctx; their rows' leases run out and they are retried,
		// with the same Idempotency-Key, by the next deliverer.
		return p.cancelAndWait(ctx, cancel)
	}
	start(p, func(context.Context) error { return dl.Run(dctx) })
	return nil
}

package daemon

import (
	"errors"

	"github.com/idemd/idemd/consumer"
	"github.com/idemd/idemd/delivery"
	"github.com/idemd/idemd/internal/config"
	"github.com/idemd/idemd/receiver"
)

// ReceiverConfig maps the sources of the pipelines file onto the receiver's Config. Schema
// and Logger are the caller's to fill.
func ReceiverConfig(f *config.File) (*receiver.Config, error) {
	cfg := &receiver.Config{}
	var errs []error
	for _, s := range f.Sources {
		src := receiver.Source{
			Name: s.Name,
			Path: s.Path,
			Verify: receiver.Verify{
				Scheme:    s.Verify.Scheme,
				Secrets:   s.Verify.Secrets,
				Tolerance: s.Verify.Tolerance.Duration,
				Header:    s.Verify.Header,
				Encoding:  s.Verify.Encoding,
				Tokens:    s.Verify.Tokens,
			},
			AllowUnverified:        s.AllowUnverified,
			AllowUnsignedMessageID: s.AllowUnsignedMessageID,
			Retention:              s.Retention.Duration,
			BodyLimit:              s.MaxBodyBytes,
		}
		if s.MessageID != nil {
			src.MessageID = receiver.IDSpec{JSON: s.MessageID.JSON, Header: s.MessageID.Header}
		}
		if s.Effect != nil {
			src.Effect = receiver.Effect{SQL: s.Effect.SQL, Status: s.Effect.Status}
		}
		if s.Idempotency != nil {
			src.Idempotency = &receiver.Idempotency{Required: s.Idempotency.Required, Retention: s.Idempotency.Retention.Duration}
		}
		if p := s.Publish; p != nil {
			pub := &receiver.Publish{Topic: p.Topic, Body: p.Body}
			if p.HTTP != nil {
				pub.Endpoint = s.Name // the endpoint DeliveryEndpoints names after the pipeline
			}
			if p.Key != nil {
				pub.Key = receiver.IDSpec{JSON: p.Key.JSON, Header: p.Key.Header}
			}
			src.Publish = pub
		}
		cfg.Sources = append(cfg.Sources, src)
	}
	return cfg, errors.Join(errs...)
}

// ConsumerConfigs maps the subscriptions of the pipelines file onto consumer Configs, one
// per subscription. Brokers, Schema and Logger are the caller's to fill.
func ConsumerConfigs(f *config.File) ([]*consumer.Config, error) {
	var out []*consumer.Config
	var errs []error
	field := func(e *config.Extractor) *consumer.Field {
		if e == nil {
			return nil
		}
		return &consumer.Field{JSON: e.JSON, Header: e.Header, Key: e.Key}
	}
	for _, s := range f.Subscriptions {
		c := &consumer.Config{
			Name:      s.Name,
			Topics:    s.Topics,
			Group:     s.Group,
			MessageID: field(s.MessageID),
			Retention: s.Retention.Duration,
		}
		if s.Effect != nil {
			c.SQL = s.Effect.SQL
		}
		if s.Order != nil {
			c.Order = &consumer.Order{Entity: *field(&s.Order.Entity), Version: *field(&s.Order.Version)}
		}
		if s.DeadLetter != nil {
			c.DeadLetter = consumer.DeadLetter{Topic: s.DeadLetter.Topic, MaxAttempts: s.DeadLetter.MaxAttempts}
		}
		if p := s.Publish; p != nil {
			if p.Body == "effect" {
				errs = append(errs, s.Errorf("publish.body", "subscriptions publish the consumed payload; body effect is for sources"))
			}
			c.Publish = &consumer.Publish{Topic: p.Topic, Key: field(p.Key)}
			if p.HTTP != nil {
				c.Publish.Endpoint = s.Name
			}
		}
		out = append(out, c)
	}
	return out, errors.Join(errs...)
}

// DeliveryEndpoints collects the outbound HTTP endpoints of the pipelines file
// (publish.http), one per pipeline, named after it: the receiver and the consumers name the
// same endpoint in the events they enqueue.
func DeliveryEndpoints(f *config.File) []delivery.Endpoint {
	var out []delivery.Endpoint
	add := func(name string, p *config.Publish) {
		if p == nil || p.HTTP == nil {
			return
		}
		out = append(out, delivery.Endpoint{Name: name, URL: p.HTTP.URL, Secret: p.HTTP.Secret, Timeout: p.HTTP.Timeout.Duration})
	}
	for _, s := range f.Sources {
		add(s.Name, s.Publish)
	}
	for _, s := range f.Subscriptions {
		add(s.Name, s.Publish)
	}
	return out
}

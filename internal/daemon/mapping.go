package daemon

import (
	"errors"

	"github.com/idemd/idemd/consumer"
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
			AllowUnverified: s.AllowUnverified,
			Retention:       s.Retention.Duration,
			BodyLimit:       s.MaxBodyBytes,
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
			if p.HTTP != nil {
				errs = append(errs, s.Errorf("publish.http", "the outbound HTTP sink is not available in this build; publish to a topic"))
			}
			if p.Topic != "" {
				pub := &receiver.Publish{Topic: p.Topic, Body: p.Body}
				if p.Key != nil {
					pub.Key = receiver.IDSpec{JSON: p.Key.JSON, Header: p.Key.Header}
				}
				src.Publish = pub
			}
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
			if p.HTTP != nil {
				errs = append(errs, s.Errorf("publish.http", "the outbound HTTP sink is not available in this build; publish to a topic"))
			}
			if p.Body == "effect" {
				errs = append(errs, s.Errorf("publish.body", "subscriptions publish the consumed payload; body effect is for sources"))
			}
			if p.Topic != "" {
				c.Publish = &consumer.Publish{Topic: p.Topic, Key: field(p.Key)}
			}
		}
		out = append(out, c)
	}
	return out, errors.Join(errs...)
}

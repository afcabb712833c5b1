// Package config reads and validates the pipelines file (idemd.yaml): the HTTP sources and
// the subscriptions (Kafka, Pub/Sub, SQS) idemd runs. Guarantee: Load returns a File only when every problem
// of the file is absent; otherwise it returns all of them at once (errors.Join of *Error),
// each naming the file, the line, the pipeline and the field, so that an operator fixes the
// file in one pass. Secrets never live in the file: it names environment variables, which
// Load resolves through the lookup function the caller passes (only cmd/ reads the
// environment).
package config

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/idemd/idemd/consumer"
	"github.com/idemd/idemd/delivery"
	"github.com/idemd/idemd/internal/effectsql"
	"github.com/idemd/idemd/pipeline"
	"github.com/idemd/idemd/receiver"
)

// Schemes are the verification schemes of sources (SPEC 3.1).
var Schemes = []string{"stripe", "standard-webhooks", "github", "shopify", "slack", "hmac-sha256", "bearer", "none"}

// SQLParameters are the named parameters effect SQL may use (pgx named arguments).
var SQLParameters = effectsql.Params

// File is a parsed and validated pipelines file. Its pipelines are the doors' own configs:
// a source is a receiver.Source, a subscription a consumer.Config, with the secrets the file
// names resolved from the environment; the fields the file does not set keep their zero
// values, which the doors fill with their defaults.
type File struct {
	// Path is where the file was read from ("" when parsed from memory).
	Path string `yaml:"-"`
	// Sources are the inbound HTTP pipelines.
	Sources []*receiver.Source `yaml:"sources"`
	// Subscriptions are the inbound broker pipelines (Kafka, Pub/Sub, SQS).
	Subscriptions []*consumer.Config `yaml:"subscriptions"`

	// locs locates each pipeline's fields for errors found after Load.
	locs map[any]*where
}

// Lookup resolves an environment variable, like os.LookupEnv.
type Lookup func(name string) (string, bool)

// Load reads and validates the pipelines file at path, resolving secrets through lookup.
// See Parse for what it returns on error.
func Load(path string, lookup Lookup) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("error reading pipelines file: %w", err)
	}
	return Parse(path, data, lookup)
}

// Parse is Load on data read from name. When the file has problems, the error lists them
// all; the File returned beside it, when not nil, is partial and good only for more
// diagnostics (File.PrepareSQL).
func Parse(name string, data []byte, lookup Lookup) (*File, error) {
	if lookup == nil {
		lookup = func(string) (string, bool) { return "", false }
	}
	p := &parser{file: name, lookup: lookup}
	f := p.parse(data)
	if len(p.errs) > 0 {
		sort.SliceStable(p.errs, func(i, j int) bool { return p.errs[i].Line < p.errs[j].Line })
		errs := make([]error, len(p.errs))
		for i, e := range p.errs {
			errs[i] = e
		}
		// The partial file lets `idemd check` prepare the SQL of a file that has other
		// problems too, and report everything at once.
		return f, errors.Join(errs...)
	}
	return f, nil
}

// Error is one problem of a pipelines file.
type Error struct {
	// File is the pipelines file.
	File string
	// Line is the 1-based line of the field, 0 when unknown.
	Line int
	// Pipeline names the pipeline, as `sources[0] "stripe"`; "" for file-level problems.
	Pipeline string
	// Field is the dotted path of the field inside the pipeline, such as verify.scheme.
	Field string
	// Msg says what is wrong.
	Msg string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	b.WriteString(": ")
	if e.Pipeline != "" {
		b.WriteString(e.Pipeline)
		b.WriteString(": ")
	}
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Pipelines returns the names of every pipeline, sources first.
func (f *File) Pipelines() []string {
	var out []string
	for _, s := range f.Sources {
		out = append(out, s.Name)
	}
	for _, s := range f.Subscriptions {
		out = append(out, s.Name)
	}
	return out
}

// Topics returns every topic the file publishes to or consumes, sorted and unique.
func (f *File) Topics() []string {
	set := map[string]bool{}
	add := func(ts pipeline.Targets) {
		for _, t := range ts {
			if t.Topic != "" {
				set[t.Topic] = true
			}
		}
	}
	for _, s := range f.Sources {
		add(s.Publish)
	}
	for _, s := range f.Subscriptions {
		add(s.Publish)
		for _, t := range s.Topics {
			set[t] = true
		}
		if s.DeadLetter.Topic != "" {
			set[s.DeadLetter.Topic] = true
		}
	}
	out := make([]string, 0, len(set))
	for t := range set {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// Errorf returns an *Error about field of pipeline p (one of the file's *receiver.Source
// or *consumer.Config), with its line, for problems found after Load.
func (f *File) Errorf(p any, field, format string, args ...any) error {
	return f.locs[p].errorf(field, format, args...)
}

// Receiver returns the receiver's config for the file's sources: copies, so that the caller
// may fill the process's fields (Schema, Logger…) without touching the file.
func (f *File) Receiver() *receiver.Config {
	cfg := &receiver.Config{}
	for _, s := range f.Sources {
		cfg.Sources = append(cfg.Sources, *s)
	}
	return cfg
}

// Consumers returns one consumer config per subscription: copies, for the caller to fill
// the process's fields (Brokers, Schema, Logger…).
func (f *File) Consumers() []*consumer.Config {
	out := make([]*consumer.Config, len(f.Subscriptions))
	for i, s := range f.Subscriptions {
		c := *s
		out[i] = &c
	}
	return out
}

// DeliveryEndpoints returns the outbound HTTP endpoints of the file (publish.http), one per
// HTTP target, named by pipeline.Targets.Endpoint: the receiver and the consumers name the
// same endpoint in the events they enqueue.
func (f *File) DeliveryEndpoints() []delivery.Endpoint {
	var out []delivery.Endpoint
	add := func(name string, ts pipeline.Targets) {
		for i, t := range ts {
			if h := t.HTTP; h != nil {
				out = append(out, delivery.Endpoint{
					Name: ts.Endpoint(name, i), URL: h.URL, Secret: h.Secret, Timeout: h.Timeout,
					Retry: h.Retry, Rate: h.Rate, Breaker: h.Breaker,
				})
			}
		}
	}
	for _, s := range f.Sources {
		add(s.Name, s.Publish)
	}
	for _, s := range f.Subscriptions {
		add(s.Name, s.Publish)
	}
	return out
}

package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/smithy-go"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemd/idemd/config"
	"github.com/idemd/idemd/consumer"
	"github.com/idemd/idemd/internal/brokerenv"
	"github.com/idemd/idemd/outbox"
)

// The Pub/Sub and SQS side of the daemon: the clients the pipelines need, made from their
// usual environment (internal/brokerenv) when the daemon is built, so that serve refuses to
// start, and check says so, when a project, a region or credentials are missing.

// clientsTimeout bounds making the clients (the AWS configuration is read from files; the
// Google credentials may be looked up on the metadata server).
const clientsTimeout = 30 * time.Second

// brokerClients makes the clients the roles of c need for the resources res names: the
// Pub/Sub clients of every project named, the SQS client. nil when none is needed.
func brokerClients(c *daemonConfig, res *config.Resources) (*brokerenv.Clients, error) {
	consumes, publishes := c.has(roleConsumer), c.has(roleRelay)
	needPubSub := (consumes && len(res.PubSubSubscriptions) > 0) || (publishes && len(res.PubSubTopics) > 0)
	needSQS := (consumes && len(res.SQSSubscriptions) > 0) || (publishes && len(res.SQSTargets) > 0)
	if !needPubSub && !needSQS {
		return nil, nil
	}
	lookup := c.Lookup
	if lookup == nil {
		lookup = func(string) (string, bool) { return "", false }
	}
	clients := brokerenv.New(lookup)
	ctx, cancel := context.WithTimeout(context.Background(), clientsTimeout)
	defer cancel()
	var errs []error
	if needPubSub {
		if consumes {
			for _, s := range res.PubSubSubscriptions {
				if _, err := clients.PubSub(ctx, subscriptionProject(s)); err != nil {
					errs = append(errs, fmt.Errorf("subscription %q (pubsub.subscription %s): %w", s.Pipeline, s.Name, err))
				}
			}
		}
		if publishes && len(res.PubSubTopics) > 0 {
			if _, err := clients.PubSub(ctx, publishProject(lookup, res)); err != nil {
				errs = append(errs, fmt.Errorf("the relay (publish targets on Pub/Sub topics %v): %w", res.PubSubTopics, err))
			}
		}
	}
	if needSQS {
		if _, err := clients.SQS(ctx); err != nil {
			errs = append(errs, fmt.Errorf("SQS (queues %v): %w", slices.Compact(slices.Sorted(slices.Values(append(append([]string{}, res.SQSSubscriptions...), res.SQSTargets...)))), err))
		}
	}
	if len(errs) > 0 {
		_ = clients.Close()
		return nil, errors.Join(errs...)
	}
	return clients, nil
}

// subscriptionProject is the project of a subscription's client: its project:, else the
// project of its full name, else the environment's ("").
func subscriptionProject(s config.PubSubName) string {
	if s.Project != "" {
		return s.Project
	}
	return config.ProjectOf(s.Name)
}

// publishProject is the project of the relay's Pub/Sub client: the environment's, else the
// project of the first target named in full (a client publishes to full names of any
// project).
func publishProject(lookup brokerenv.Lookup, res *config.Resources) string {
	if p := brokerenv.PubSubProject(lookup); p != "" {
		return p
	}
	for _, t := range res.PubSubTopics {
		if p := config.ProjectOf(t); p != "" {
			return p
		}
	}
	return ""
}

// subscriptionClient gives a Pub/Sub or SQS subscription its client.
func (d *daemon) subscriptionClient(cfg *consumer.Config) error {
	ctx, cancel := context.WithTimeout(context.Background(), clientsTimeout)
	defer cancel()
	var err error
	switch cfg.Door() {
	case consumer.DoorPubSub:
		cfg.PubSubClient, err = d.clients.PubSub(ctx, subscriptionProject(config.PubSubName{Name: cfg.PubSub.Subscription, Project: cfg.PubSub.Project}))
	case consumer.DoorSQS:
		cfg.SQSClient, err = d.clients.SQS(ctx)
	}
	return err
}

// publishers are the relay's Pub/Sub and SQS publishers, for the targets the pipelines name
// (nil for a broker they do not name).
func (d *daemon) publishers() (pubsubPub, sqsPub outbox.Publisher, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), clientsTimeout)
	defer cancel()
	if len(d.res.PubSubTopics) > 0 {
		cl, err := d.clients.PubSub(ctx, publishProject(d.cfg.Lookup, &d.res))
		if err != nil {
			return nil, nil, err
		}
		p, err := outbox.NewPubSubPublisher(cl, &outbox.PubSubPublisherConfig{})
		if err != nil {
			return nil, nil, err
		}
		pubsubPub = p
	}
	if len(d.res.SQSTargets) > 0 {
		cl, err := d.clients.SQS(ctx)
		if err != nil {
			return nil, nil, err
		}
		if sqsPub, err = outbox.NewSQSPublisher(cl); err != nil {
			return nil, nil, err
		}
	}
	return pubsubPub, sqsPub, nil
}

// close releases what newDaemon made: the pool and the broker clients. After a drain that
// overran it releases nothing: the parts it abandoned still hold connections, which closing
// the pool would wait for, and the process's exit closes them all.
func (d *daemon) close() {
	if d.overran {
		return
	}
	d.pool.Close()
	closeClients(d.clients, d.log)
}

func closeClients(c *brokerenv.Clients, log *logrus.Entry) {
	if c == nil {
		return
	}
	if err := c.Close(); err != nil {
		log.WithError(err).Warn("error closing the Pub/Sub clients")
	}
}

// checkBrokers reaches Pub/Sub and SQS as the roles would (check). A subscription whose
// Pub/Sub subscription or SQS queue does not exist is a problem: serve would stop. A publish
// target whose topic or queue does not exist is a warning: the relay holds its events until
// it exists (IDEMD_RELAY_MAX_FAILING_FOR). reached says which broker answered. Each
// resource is looked for at once, each within its own timeout (0: ctx's, and the client's
// own), so that a broker that does not answer takes no time from the other's.
func (d *daemon) checkBrokers(ctx context.Context, timeout time.Duration) (problems, warnings []error, reached []string) {
	if d.clients == nil {
		return nil, nil, nil
	}
	// A resource to look for: what it is, whose it is, and how to find it ("" when it
	// exists, else its name as the broker knows it).
	type resource struct {
		broker, kind, name, pipeline string
		consumed                     bool
		missing                      func(context.Context) (string, error)
	}
	var all []resource
	if d.cfg.has(roleConsumer) {
		for _, s := range d.res.PubSubSubscriptions {
			all = append(all, resource{"Pub/Sub", "subscription", s.Name, s.Pipeline, true,
				func(ctx context.Context) (string, error) {
					return d.pubsubMissing(ctx, subscriptionProject(s), "subscriptions", s.Name)
				}})
		}
		for _, q := range d.res.SQSSubscriptions {
			all = append(all, resource{"SQS", "queue", q, d.sqsPipelines(q), true, func(ctx context.Context) (string, error) { return d.sqsMissing(ctx, q) }})
		}
	}
	if d.cfg.has(roleRelay) {
		for _, t := range d.res.PubSubTopics {
			all = append(all, resource{"Pub/Sub", "topic", t, "", false,
				func(ctx context.Context) (string, error) {
					return d.pubsubMissing(ctx, publishProject(d.cfg.Lookup, &d.res), "topics", t)
				}})
		}
		for _, q := range d.res.SQSTargets {
			all = append(all, resource{"SQS", "queue", q, "", false, func(ctx context.Context) (string, error) { return d.sqsMissing(ctx, q) }})
		}
	}
	type answer struct {
		missing string
		err     error
	}
	answers := make([]answer, len(all))
	var wg sync.WaitGroup
	for i, r := range all {
		wg.Go(func() {
			ctx := ctx
			if timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, timeout)
				defer cancel()
			}
			answers[i].missing, answers[i].err = r.missing(ctx)
		})
	}
	wg.Wait()
	answered := map[string]bool{}
	for i, r := range all {
		whose := ""
		if r.pipeline != "" {
			whose = fmt.Sprintf("subscription %q: ", r.pipeline)
		}
		missing, err := answers[i].missing, answers[i].err
		switch {
		case err != nil:
			warnings = append(warnings, fmt.Errorf("%s%s does not answer (%s %s): %w", whose, r.broker, r.kind, r.name, err))
		case missing != "" && r.consumed:
			problems = append(problems, fmt.Errorf("%sthe %s %s %s does not exist: serve would stop (idemd creates none outside idemd dev)", whose, r.broker, r.kind, missing))
		case missing != "":
			warnings = append(warnings, fmt.Errorf("the %s %s %s does not exist: serve starts, but the relay holds its events until it does (and dead-letters them after IDEMD_RELAY_MAX_FAILING_FOR)", r.broker, r.kind, missing))
		}
		if err == nil {
			answered[r.broker] = true
		}
	}
	for _, b := range []string{"Pub/Sub", "SQS"} {
		if answered[b] {
			reached = append(reached, b+" answers")
		}
	}
	return problems, warnings, reached
}

// sqsPipelines names the subscriptions that consume queue, for check's messages.
func (d *daemon) sqsPipelines(queue string) string {
	var names []string
	for _, s := range d.cfg.Pipelines.Subscriptions {
		if s.SQS != nil && s.SQS.Queue == queue {
			names = append(names, s.Name)
		}
	}
	return strings.Join(names, ", ")
}

// pubsubMissing returns the full name of the Pub/Sub resource (kind "subscriptions" or
// "topics") when it does not exist, "" when it does.
func (d *daemon) pubsubMissing(ctx context.Context, project, kind, name string) (string, error) {
	cl, err := d.clients.PubSub(ctx, project)
	if err != nil {
		return "", err
	}
	full := name
	if config.ProjectOf(name) == "" {
		full = "projects/" + cl.Project() + "/" + kind + "/" + name
	}
	if kind == "subscriptions" {
		_, err = cl.SubscriptionAdminClient.GetSubscription(ctx, &pubsubpb.GetSubscriptionRequest{Subscription: full})
	} else {
		_, err = cl.TopicAdminClient.GetTopic(ctx, &pubsubpb.GetTopicRequest{Topic: full})
	}
	if status.Code(err) == codes.NotFound {
		return full, nil
	}
	return "", err
}

// sqsMissing returns queue (a name or a URL) when it does not exist, "" when it does.
func (d *daemon) sqsMissing(ctx context.Context, queue string) (string, error) {
	cl, err := d.clients.SQS(ctx)
	if err != nil {
		return "", err
	}
	if strings.Contains(queue, "://") {
		_, err = cl.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(queue)})
	} else {
		_, err = cl.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(queue)})
	}
	var api smithy.APIError
	if errors.As(err, &api) {
		switch strings.TrimPrefix(api.ErrorCode(), "AWS.SimpleQueueService.") {
		case "QueueDoesNotExist", "NonExistentQueue":
			return queue, nil
		}
	}
	return "", err
}

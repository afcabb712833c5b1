package brokerenv

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemd/idemd/internal/sqsfake"
)

// DevProject is the Pub/Sub project of `idemd dev`'s fake.
const DevProject = "idemd-dev"

// DevNeeds are the Pub/Sub and SQS resources the pipelines name, which `idemd dev`
// creates in its fakes.
type DevNeeds struct {
	// PubSubTopics and PubSubSubscriptions are ids or full names. In dev, a topic and a
	// subscription of the same id go together: each topic gets a subscription of its id,
	// and each subscription is made on the topic of its id.
	PubSubTopics, PubSubSubscriptions []string
	// SQSQueues are queue names; a name ending in .fifo makes a FIFO queue.
	SQSQueues []string
}

// Dev is the development fakes of `idemd dev`: Google's pstest for Pub/Sub and goaws for
// SQS, in process and in memory. Nothing survives a restart: they are for development only.
type Dev struct {
	// Env are the variables that point the clients at the fakes (PUBSUB_EMULATOR_HOST,
	// PUBSUB_PROJECT_ID, AWS_ENDPOINT_URL_SQS, AWS_REGION and test credentials).
	Env map[string]string
	// PubSubAddr and SQSURL are the fakes' addresses ("" when not started).
	PubSubAddr, SQSURL string

	pubsub *pstest.Server
	sqs    *sqsfake.Server
}

// StartDev starts the fakes the pipelines need and lookup does not point elsewhere: Pub/Sub
// when some resource is named and PUBSUB_EMULATOR_HOST is unset, SQS when some queue is
// named and no SQS endpoint is set. It creates every resource named.
func StartDev(ctx context.Context, need DevNeeds, lookup Lookup) (*Dev, error) {
	d := &Dev{Env: map[string]string{}}
	if len(need.PubSubTopics)+len(need.PubSubSubscriptions) > 0 && lookup.get("PUBSUB_EMULATOR_HOST") == "" {
		d.pubsub = pstest.NewServer()
		d.PubSubAddr = d.pubsub.Addr
		d.Env["PUBSUB_EMULATOR_HOST"] = d.pubsub.Addr
		if PubSubProject(lookup) == "" {
			d.Env["PUBSUB_PROJECT_ID"] = DevProject
		}
		if err := d.createPubSub(ctx, need, lookup); err != nil {
			_ = d.Close()
			return nil, err
		}
	}
	if len(need.SQSQueues) > 0 && SQSEndpoint(lookup) == "" {
		srv, err := sqsfake.Start("127.0.0.1:0")
		if err != nil {
			_ = d.Close()
			return nil, fmt.Errorf("error starting the in-process SQS: %w", err)
		}
		d.sqs, d.SQSURL = srv, srv.URL()
		d.Env["AWS_ENDPOINT_URL_SQS"] = srv.URL()
		if SQSRegion(lookup) == "" {
			d.Env["AWS_REGION"] = sqsfake.Region
		}
		if lookup.get("AWS_ACCESS_KEY_ID") == "" {
			d.Env["AWS_ACCESS_KEY_ID"], d.Env["AWS_SECRET_ACCESS_KEY"] = "dev", "dev"
		}
		if err := d.createSQS(ctx, need.SQSQueues, lookup); err != nil {
			_ = d.Close()
			return nil, err
		}
	}
	return d, nil
}

// lookup is the environment with the fakes' variables first.
func (d *Dev) lookup(base Lookup) Lookup {
	return func(name string) (string, bool) {
		if v, ok := d.Env[name]; ok {
			return v, true
		}
		return base(name)
	}
}

func (d *Dev) createPubSub(ctx context.Context, need DevNeeds, base Lookup) error {
	cs := New(d.lookup(base))
	defer cs.Close() //nolint:errcheck // a dev client
	cl, err := cs.PubSub(ctx, "")
	if err != nil {
		return err
	}
	project := PubSubProject(d.lookup(base))
	ids := map[string]bool{}
	for _, n := range append(append([]string{}, need.PubSubTopics...), need.PubSubSubscriptions...) {
		ids[n[strings.LastIndex(n, "/")+1:]] = true
	}
	for id := range ids {
		topic := "projects/" + project + "/topics/" + id
		if _, err := cl.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: topic}); err != nil && status.Code(err) != codes.AlreadyExists {
			return fmt.Errorf("error creating the dev Pub/Sub topic %s: %w", id, err)
		}
		sub := &pubsubpb.Subscription{
			Name: "projects/" + project + "/subscriptions/" + id, Topic: topic,
			EnableMessageOrdering: true, AckDeadlineSeconds: 30,
		}
		if _, err := cl.SubscriptionAdminClient.CreateSubscription(ctx, sub); err != nil && status.Code(err) != codes.AlreadyExists {
			return fmt.Errorf("error creating the dev Pub/Sub subscription %s: %w", id, err)
		}
	}
	return nil
}

func (d *Dev) createSQS(ctx context.Context, queues []string, base Lookup) error {
	cs := New(d.lookup(base))
	cl, err := cs.SQS(ctx)
	if err != nil {
		return err
	}
	for _, q := range queues {
		name := q[strings.LastIndex(q, "/")+1:]
		attrs := map[string]string{}
		if strings.HasSuffix(name, ".fifo") {
			attrs["FifoQueue"] = "true"
		}
		if _, err := cl.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs}); err != nil {
			return fmt.Errorf("error creating the dev SQS queue %s: %w", name, err)
		}
	}
	return nil
}

// Close stops the fakes; what they held is gone.
func (d *Dev) Close() error {
	var errs []error
	if d.pubsub != nil {
		errs = append(errs, d.pubsub.Close())
	}
	if d.sqs != nil {
		errs = append(errs, d.sqs.Close())
	}
	return errors.Join(errs...)
}

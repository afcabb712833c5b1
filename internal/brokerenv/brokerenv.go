// Package brokerenv builds idemd's Google Cloud Pub/Sub and Amazon SQS clients from the
// environment those clients usually read, so that idemd is configured for them like any
// other program on Google Cloud or AWS:
//
//   - Pub/Sub: PUBSUB_EMULATOR_HOST (an emulator or fake: plain gRPC, no credentials),
//     PUBSUB_PROJECT_ID or GOOGLE_CLOUD_PROJECT (the project of names that are not full
//     resource names), and otherwise Google's Application Default Credentials
//     (GOOGLE_APPLICATION_CREDENTIALS, the metadata server, gcloud's login).
//   - SQS: AWS_ENDPOINT_URL_SQS or AWS_ENDPOINT_URL (a non-AWS endpoint), AWS_REGION or
//     AWS_DEFAULT_REGION, and the AWS SDK's default credential chain (AWS_ACCESS_KEY_ID and
//     AWS_SECRET_ACCESS_KEY, AWS_PROFILE and the shared files, web identity, ECS and EC2
//     roles).
//
// Clients are made on first use and shared; Close closes them.
package brokerenv

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"cloud.google.com/go/pubsub/v2"
	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Var is one environment variable the clients read, for --help and the README.
type Var struct {
	Name, Help string
}

// Vars are the variables the Pub/Sub and SQS clients read, in the order --help lists them.
var Vars = []Var{
	{"PUBSUB_EMULATOR_HOST", "host:port of a Pub/Sub emulator (plain gRPC, no credentials); dev: an in-process fake when unset"},
	{"PUBSUB_PROJECT_ID", "Google Cloud project of Pub/Sub topics and subscriptions named without projects/…/ (else GOOGLE_CLOUD_PROJECT)"},
	{"GOOGLE_CLOUD_PROJECT", "the same, when PUBSUB_PROJECT_ID is unset"},
	{"GOOGLE_APPLICATION_CREDENTIALS", "service account key file of Pub/Sub (default: Application Default Credentials: metadata server, gcloud login)"},
	{"AWS_ENDPOINT_URL_SQS", "SQS endpoint URL, for a local or compatible SQS (else AWS_ENDPOINT_URL, else AWS's); dev: an in-process fake when unset"},
	{"AWS_REGION", "AWS region of SQS (else AWS_DEFAULT_REGION or the shared config's); required by SQS"},
	{"AWS_ACCESS_KEY_ID", "with AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN): SQS credentials; else the AWS SDK's default chain (AWS_PROFILE, web identity, ECS and EC2 roles)"},
}

// Lookup reads an environment variable.
type Lookup func(name string) (string, bool)

func (l Lookup) get(names ...string) string {
	for _, n := range names {
		if v, ok := l(n); ok && v != "" {
			return v
		}
	}
	return ""
}

// PubSubProject is the project of names that are not full resource names:
// PUBSUB_PROJECT_ID, else GOOGLE_CLOUD_PROJECT; "" when neither is set.
func PubSubProject(lookup Lookup) string {
	return lookup.get("PUBSUB_PROJECT_ID", "GOOGLE_CLOUD_PROJECT")
}

// SQSRegion is the region of the SQS client: AWS_REGION, else AWS_DEFAULT_REGION; "" when
// neither is set (the SDK may still find one in the shared config file).
func SQSRegion(lookup Lookup) string { return lookup.get("AWS_REGION", "AWS_DEFAULT_REGION") }

// SQSEndpoint is the SQS endpoint URL: AWS_ENDPOINT_URL_SQS, else AWS_ENDPOINT_URL; "" for
// AWS's own.
func SQSEndpoint(lookup Lookup) string { return lookup.get("AWS_ENDPOINT_URL_SQS", "AWS_ENDPOINT_URL") }

// ErrNoProject is returned when a Pub/Sub client is asked for without a project.
var ErrNoProject = errors.New("no Google Cloud project: set PUBSUB_PROJECT_ID (or GOOGLE_CLOUD_PROJECT), give the pipeline's pubsub.project, or name the subscription or topic in full (projects/P/…)")

// ErrNoRegion is returned when the SQS client has no region.
var ErrNoRegion = errors.New("no AWS region for SQS: set AWS_REGION (or AWS_DEFAULT_REGION, or region in the shared AWS config)")

// Clients makes and shares the Pub/Sub clients (one per project) and the SQS client.
type Clients struct {
	lookup Lookup

	mu     sync.Mutex
	pubsub map[string]*pubsub.Client
	sqs    *sqs.Client
}

// New returns Clients reading lookup (the process environment in idemd; tests give their
// own). Nothing connects until a client is asked for.
func New(lookup Lookup) *Clients {
	return &Clients{lookup: lookup, pubsub: map[string]*pubsub.Client{}}
}

// PubSub returns the client of project ("" is PubSubProject's).
func (c *Clients) PubSub(ctx context.Context, project string) (*pubsub.Client, error) {
	if project == "" {
		project = PubSubProject(c.lookup)
	}
	if project == "" {
		return nil, ErrNoProject
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if cl, ok := c.pubsub[project]; ok {
		return cl, nil
	}
	// The client's default telemetry is off: its gRPC stats handler would record a span per
	// call (google.pubsub.v1.Publisher/Publish, GetTopic…) on OpenTelemetry's global
	// provider, which serve installs when tracing is on, each a root trace unrelated to the
	// message's; idemd makes its own spans (docs/daemon.md, Tracing).
	opts := []option.ClientOption{option.WithTelemetryDisabled()}
	if host := c.lookup.get("PUBSUB_EMULATOR_HOST"); host != "" {
		// What the client does by itself when the variable is in the process environment;
		// done here so that the lookup decides.
		opts = append(opts, option.WithEndpoint(host), option.WithoutAuthentication(),
			option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	}
	// Otherwise the client finds Application Default Credentials itself
	// (GOOGLE_APPLICATION_CREDENTIALS, the metadata server, gcloud's login).
	// Nor does it trace messages itself (publish, receive and ack spans, off by default).
	cl, err := pubsub.NewClientWithConfig(ctx, project, &pubsub.ClientConfig{EnableOpenTelemetryTracing: false}, opts...)
	if err != nil {
		return nil, fmt.Errorf("error creating the Pub/Sub client of project %s: %w", project, err)
	}
	c.pubsub[project] = cl
	return cl, nil
}

// SQS returns the SQS client.
func (c *Clients) SQS(ctx context.Context) (*sqs.Client, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sqs != nil {
		return c.sqs, nil
	}
	opts := []func(*awsconfig.LoadOptions) error{}
	if r := SQSRegion(c.lookup); r != "" {
		opts = append(opts, awsconfig.WithRegion(r))
	}
	if id, secret := c.lookup.get("AWS_ACCESS_KEY_ID"), c.lookup.get("AWS_SECRET_ACCESS_KEY"); id != "" && secret != "" {
		opts = append(opts, awsconfig.WithCredentialsProvider(
			credentials.NewStaticCredentialsProvider(id, secret, c.lookup.get("AWS_SESSION_TOKEN"))))
	}
	cfg, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("error loading the AWS configuration for SQS: %w", err)
	}
	if cfg.Region == "" {
		return nil, ErrNoRegion
	}
	endpoint := SQSEndpoint(c.lookup)
	c.sqs = sqs.NewFromConfig(cfg, func(o *sqs.Options) {
		if endpoint != "" {
			o.BaseEndpoint = aws.String(endpoint)
		}
	})
	return c.sqs, nil
}

// Close closes the Pub/Sub clients made so far (the SQS client holds nothing to close).
func (c *Clients) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for p, cl := range c.pubsub {
		if err := cl.Close(); err != nil {
			errs = append(errs, fmt.Errorf("error closing the Pub/Sub client of %s: %w", p, err))
		}
		delete(c.pubsub, p)
	}
	return errors.Join(errs...)
}

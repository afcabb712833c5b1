package receiver

import (
	"context"
	"time"

	"github.com/idemd/idemd/outbox"
	"github.com/idemd/idemd/pipeline"
	"github.com/idemd/idemd/processed"
	"github.com/jackc/pgx/v5"
	"github.com/sirupsen/logrus"
	"go.opentelemetry.io/otel/trace"
)

// Defaults of Config and Source; the retentions and MaxAttempts are the pipeline
// package's.
const (
	MaxBatchDefault     = 128
	LingerDefault       = 2 * time.Millisecond
	ApplyTimeoutDefault = 5 * time.Second
	LeaseDefault        = 30 * time.Second
	MaxWaitDefault      = 30 * time.Second
	BodyLimitDefault    = 1 << 20
	// MaxUnverifiedBytesDefault bounds the bodies read but not yet verified, all requests
	// together: 64 bodies of 1 MiB, or thousands of typical webhooks.
	MaxUnverifiedBytesDefault = 64 << 20
	// StatusDefault is the status of a new API request whose effect committed.
	StatusDefault = 200
)

// Config configures a Receiver. It is plain data: the daemon fills it from the pipelines
// file, with secrets read from the environment variables the file names.
type Config struct {
	// Sources are the HTTP endpoints. At least one is required.
	Sources []Source
	// Schema holds idemd's tables (processed_messages, outbox, dead_letters). Defaults to
	// "idemd" (migrations.SchemaDefault).
	Schema string
	// MaxBatch is how many concurrent webhook requests one transaction may carry (group
	// commit). 1 gives one transaction per request. Defaults to 128.
	MaxBatch int
	// Linger is the most a batch waits for more requests while earlier batches are still
	// committing: once per batch, from its first wait, however many requests arrive
	// meanwhile; an idle receiver never waits. A batch waits half the receiver's recent
	// transactions' mean duration when that is shorter: where the database's CPU idles
	// while transactions wait on their commits, commits are quick and so is the wait, and
	// where its CPU is the bound they take longer and batches grow, which costs it less per
	// request (docs/receiver.md, "Group commit"). Negative disables it. Defaults to 2 ms.
	Linger time.Duration
	// Workers is how many webhook batches may be in their transaction at once. Defaults to
	// the pool's MaxConns.
	Workers int
	// ApplyTimeout bounds, twice over, how long a webhook request waits. First for a free
	// worker (Workers), from its arrival: when every worker's batch is still in its
	// transaction after ApplyTimeout, the request is answered 503 (busy, Retry-After: 1)
	// with nothing stored, and counted in idemd_http_rejected_total{reason="no_worker"}, so
	// that a database slower than the arrivals makes senders retry later instead of piling
	// requests up behind the workers. Then its batch's transaction, transient retries
	// (serialization failures, deadlocks, a lost connection) included, from the batch's
	// start: past it, 503 with nothing stored. A database that cannot be reached (no
	// connection can be opened) is not retried: 503 at once, nothing stored. A batch whose
	// COMMIT ended without an answer waits up to its resolve timeout (10 s) for the
	// outcome. Defaults to 5 s.
	ApplyTimeout time.Duration
	// Lease is how long an API request's reservation protects its key before a retry may
	// take it over (after a crash). Defaults to 30 s.
	Lease time.Duration
	// MaxWait caps the wait a client may ask for with "Prefer: wait=N". Defaults to 30 s.
	MaxWait time.Duration
	// MaxUnverifiedBytes bounds the bytes of request bodies being read before their
	// signature or token is checked, all requests together; each counts its Content-Length,
	// or its source's BodyLimit when chunked. A request that does not fit is answered 503
	// with Retry-After: 1 before its body is read. Defaults to 64 MiB.
	MaxUnverifiedBytes int64
	// Logger is the base entry; the receiver adds component=receiver. Defaults to logrus's
	// standard logger.
	Logger *logrus.Entry
	// Now is the clock used for signature timestamps. Defaults to time.Now.
	Now func() time.Time
	// BeforeCommit, when set, runs just before each COMMIT with the message ids of the
	// transaction; tests use it to crash at that point. Defaults to nil.
	BeforeCommit func(messageIDs []string)
	// TracerProvider records a server span per request (continuing its traceparent) and
	// the unit of work's spans. Defaults to OpenTelemetry's global provider; while that is
	// a no-op one (tracing off), no span is made, and an incoming traceparent is passed on
	// to the events as it came.
	TracerProvider trace.TracerProvider
	// Handoff passes the outbox rows of each committed batch to the relay of this process
	// (outbox.Handoff), which then need not read them back. Optional; the daemon sets it.
	Handoff *outbox.Handoff
	// Filter spares the claims the lookup of their new ids in processed_messages' older
	// epochs (processed.EpochFilter, of Schema; keep it current with its Run). Optional; the
	// daemon sets it.
	Filter *processed.EpochFilter
}

// Source is one inbound HTTP endpoint (a pipeline). It is also what a source of the
// pipelines file decodes into (the yaml names); the file names the environment variables
// that hold secrets (SecretsEnv, TokensEnv), and the daemon resolves them.
type Source struct {
	// Name names the pipeline: metrics, logs, dedup scope. Required.
	Name string `yaml:"name"`
	// Path is where the source listens for POST. Defaults to "/webhooks/{Name}".
	Path string `yaml:"path"`
	// Verify says how requests are authenticated. Required.
	Verify Verify `yaml:"verify"`
	// AllowUnverified permits Verify.Scheme "none". Defaults to false.
	AllowUnverified bool `yaml:"allow_unverified"`
	// AllowUnsignedMessageID permits MessageID.Header on an hmac-sha256 source. Its
	// signature covers the body only, so a header id is not authenticated: whoever captured
	// one signed request can send it again with a fresh id, and nothing signed says how old
	// it is. Prefer MessageID.JSON, an id inside the signed body. Defaults to false (a
	// header id on hmac-sha256 is refused at New).
	AllowUnsignedMessageID bool `yaml:"allow_unsigned_message_id"`
	// MessageID says where a webhook's id is: a JSON pointer, a header, or a composite of
	// several (Field.Parts, joined length-prefixed; a missing part is a missing id).
	// Defaults to the scheme's (SPEC 3.1): stripe JSON /id, standard-webhooks header
	// webhook-id, github X-GitHub-Delivery, shopify X-Shopify-Event-Id, slack JSON
	// /event_id; required for hmac-sha256 and none. Ignored by API sources, whose id is the
	// Idempotency-Key.
	MessageID *pipeline.Field `yaml:"message_id"`
	// Order enables the stale-event guard on a webhook source: a webhook whose version of
	// its entity is not newer than the last one applied is recorded, not applied, and
	// answered 200 {"status":"stale"}. Defaults to none (every new id is applied).
	Order *pipeline.Order `yaml:"order"`
	// Effect runs in the dedup transaction. Defaults to none (the claim is the effect).
	Effect Effect `yaml:"effect"`
	// Publish lists the targets of the source's events: each applied request writes one
	// outbox event per target whose filter matches it, in the same transaction (see
	// pipeline.Targets for their names, operation ids and endpoints). Defaults to none.
	Publish pipeline.Targets `yaml:"publish"`
	// Idempotency, when set, makes this an API source with the Idempotency-Key contract.
	// Defaults to nil (a webhook source).
	Idempotency *Idempotency `yaml:"idempotency"`
	// Delete, when set, serves DELETE {path}/{id} on an API source. Defaults to nil.
	Delete *Delete `yaml:"delete"`
	// Retention is how long webhook dedup records are kept. Defaults to 7 days
	// (pipeline.RetentionDefault).
	Retention time.Duration `yaml:"retention"`
	// BodyLimit is the largest accepted body, in bytes. Defaults to 1 MiB.
	BodyLimit int64 `yaml:"max_body_bytes"`
	// FingerprintIgnore lists extra JSON pointers left out of a webhook's fingerprint, on
	// top of the scheme's (stripe: /pending_webhooks). Defaults to none.
	FingerprintIgnore []string `yaml:"fingerprint_ignore"`
	// MaxAttempts is how many times a permanently failing effect is tried (each in its
	// savepoint) before the request is dead-lettered (webhooks) or answered 422 (API).
	// Defaults to 5 (pipeline.MaxAttemptsDefault).
	MaxAttempts int `yaml:"max_attempts"`
}

// RoutePath is where the source is served: Path, or "/webhooks/{Name}" by default.
func (s *Source) RoutePath() string {
	if s.Path != "" {
		return s.Path
	}
	return "/webhooks/" + s.Name
}

// Verify configures a verification scheme (SPEC 3.1).
type Verify struct {
	// Scheme is stripe, standard-webhooks, github, shopify, slack, hmac-sha256, bearer or
	// none. Required.
	Scheme string `yaml:"scheme"`
	// SecretsEnv names the environment variables that hold Secrets (the pipelines file).
	SecretsEnv []string `yaml:"secrets_env"`
	// Secrets are the signing secrets, all accepted at once (rotation). Stripe's whole
	// whsec_… string is the key; standard-webhooks' is base64 after whsec_. Required for
	// HMAC schemes. Defaults to none.
	Secrets []string `yaml:"-"`
	// PublicKeys are standard-webhooks Ed25519 keys (whpk_<base64>) for v1a signatures.
	// Defaults to none.
	PublicKeys []string `yaml:"-"`
	// Tolerance bounds the distance between a signed timestamp and now, both ways.
	// Defaults to 300 s.
	Tolerance time.Duration `yaml:"tolerance"`
	// Header is the signature header of hmac-sha256. Required for it. Defaults to "".
	Header string `yaml:"header"`
	// Encoding of hmac-sha256 signatures: "hex" or "base64". Defaults to "hex".
	Encoding string `yaml:"encoding"`
	// Prefix before the hmac-sha256 signature, such as "sha256=". Defaults to "".
	Prefix string `yaml:"prefix"`
	// TokensEnv names the environment variable that holds Tokens as
	// "token=tenant,token2=tenant2" (the pipelines file).
	TokensEnv string `yaml:"tokens_env"`
	// Tokens maps bearer tokens to tenants (see ParseTokens). Required for bearer.
	// Defaults to none.
	Tokens map[string]string `yaml:"-"`
}

// Effect is a source's effect: SQL with named parameters, or a Go function, or neither.
type Effect struct {
	// SQL runs with pgx named arguments @message_id @payload @headers @source @tenant @key
	// @topic @partition @offset @received_at; its returned rows are the API response body
	// and, with Publish.Body "effect", the event. On an API source, a first row with an
	// integer http_status column is a business error: that status, the row without the
	// column as body, stored and replayed (exactlyonce.StatusColumn). It must prepare at
	// New. Defaults to "".
	SQL string `yaml:"sql"`
	// Func runs in the transaction instead of SQL (library users); what it returns is
	// marshalled to JSON like returned rows. Wrap errors with exactlyonce.Permanent to
	// dead-letter rather than retry; return an *exactlyonce.BusinessError to answer an API
	// request with another status and body, stored like a success. Defaults to nil.
	Func EffectFunc `yaml:"-"`
	// Status is the HTTP status of a new API request whose effect committed. Defaults to 200.
	Status int `yaml:"status"`
}

// Idempotency makes a source an API source.
type Idempotency struct {
	// Required rejects requests without an Idempotency-Key with 400. Defaults to false.
	Required bool `yaml:"required"`
	// Retention is how long a key is remembered; after it the key is new. Defaults to 24 h
	// (pipeline.IdempotencyRetentionDefault).
	Retention time.Duration `yaml:"retention"`
	// Lookup serves GET {path}/{key}: the stored answer of a key, for its tenant, with
	// Idempotent-Replayed: true, or 404. It never runs an effect. Defaults to false.
	Lookup bool `yaml:"lookup"`
}

// Delete serves DELETE {path}/{id} on an API source: SQL runs once per (tenant, id), with
// the id as @message_id and @key, and its answer is stored and replayed to every retry
// within the idempotency retention: 204 when the statement affected rows, 404 when it
// affected none.
type Delete struct {
	// SQL is the delete effect, with the named parameters of Effect.SQL. Required.
	SQL string `yaml:"sql"`
}

// Request is what an EffectFunc sees of one request.
type Request struct {
	Source    string
	Tenant    string
	MessageID string
	// Key is the Idempotency-Key of an API request ("" for webhooks).
	Key    string
	Method string
	Path   string
	// Header has signatures, tokens and cookies removed.
	Header     map[string][]string
	Body       []byte
	ReceivedAt time.Time
}

// EffectFunc is a Go effect. It runs in the dedup transaction tx; what it returns (a value
// marshalled to JSON, or json.RawMessage / []byte already JSON) is the API response body. An
// *exactlyonce.BusinessError it returns is the API answer instead (what it wrote commits);
// any other error rolls back: permanent ones (exactlyonce.Permanent, SQLSTATE classes 22, 23,
// 42) are stored as 422 or dead-lettered, the others are transient and never stored.
type EffectFunc func(ctx context.Context, tx pgx.Tx, r *Request) (any, error)

package outbox

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
)

// SQS limits the publisher respects.
const (
	sqsBatchEntries     = 10
	sqsMaxAttributes    = 10
	sqsMaxSizeDefault   = 262144 // bytes, when the queue does not say
	sqsMaxGroupIDLength = 128
)

// HeaderBodyEncoding is the message attribute that says an SQS message body is the event's
// payload in base64: SQS bodies are text, so a payload that is not (invalid UTF-8, control
// characters) is sent encoded. idemd's SQS subscriptions decode it.
const HeaderBodyEncoding = "idemd-body-encoding"

// sqsSender is what SQSPublisher needs of an SQS client; *sqs.Client has it.
type sqsSender interface {
	GetQueueUrl(ctx context.Context, in *sqs.GetQueueUrlInput, opts ...func(*sqs.Options)) (*sqs.GetQueueUrlOutput, error)
	GetQueueAttributes(ctx context.Context, in *sqs.GetQueueAttributesInput, opts ...func(*sqs.Options)) (*sqs.GetQueueAttributesOutput, error)
	SendMessageBatch(ctx context.Context, in *sqs.SendMessageBatchInput, opts ...func(*sqs.Options)) (*sqs.SendMessageBatchOutput, error)
}

// SQSPublisher publishes outbox events to Amazon SQS with SendMessageBatch: one message per
// event, its payload as body, the event's headers with operation-id, causation-id and
// idemd-pipeline as String message attributes. On a FIFO queue (a name ending in .fifo) the
// event key is the MessageGroupId (the pipeline's name when the event has no key; a key SQS
// would refuse as a group id is replaced by its SHA-256) and the operation id is the
// MessageDeduplicationId, so that SQS itself drops a re-publish within its 5-minute window.
// Event.Topic is a queue name, resolved with GetQueueUrl, or a queue URL.
type SQSPublisher struct {
	client sqsSender

	mu     sync.Mutex
	queues map[string]*sqsQueue
}

type sqsQueue struct {
	url     string
	fifo    bool
	maxSize int
}

// NewSQSPublisher returns a publisher on client (an *sqs.Client).
func NewSQSPublisher(client sqsSender) (*SQSPublisher, error) {
	if client == nil {
		return nil, errors.New("outbox: NewSQSPublisher: client is required")
	}
	return &SQSPublisher{client: client, queues: map[string]*sqsQueue{}}, nil
}

// Close releases nothing: SQS publishes synchronously. It is there for Publisher.
func (p *SQSPublisher) Close() error { return nil }

// Publish publishes events, queue by queue in parallel, and returns the outcome of each. See
// Publisher.
func (p *SQSPublisher) Publish(ctx context.Context, events []Event) []error {
	errs := make([]error, len(events))
	byQueue := map[string][]int{}
	var order []string
	for i := range events {
		e := &events[i]
		if errs[i] = checkPublishable(e); errs[i] != nil {
			continue
		}
		if _, ok := byQueue[e.Topic]; !ok {
			order = append(order, e.Topic)
		}
		byQueue[e.Topic] = append(byQueue[e.Topic], i)
	}
	var wg sync.WaitGroup
	for _, topic := range order {
		wg.Go(func() { p.publishQueue(ctx, topic, events, byQueue[topic], errs) })
	}
	wg.Wait()
	return errs
}

// publishQueue publishes the events at idx (in order) to one queue, writing their outcomes
// into errs.
func (p *SQSPublisher) publishQueue(ctx context.Context, topic string, events []Event, idx []int, errs []error) {
	q, err := p.queue(ctx, topic)
	if err != nil {
		for _, i := range idx {
			errs[i] = err
		}
		return
	}
	b := &sqsBatch{p: p, q: q, events: events, errs: errs, failed: map[string]bool{}}
	size := 0
	for _, i := range idx {
		e := &events[i]
		entry, n, err := sqsEntry(e, q.fifo)
		if err == nil && n > q.maxSize {
			err = permanent("the message would have %d bytes; SQS queue %s takes at most %d", n, topic, q.maxSize)
		}
		if err != nil {
			errs[i] = err
			continue
		}
		if len(b.idx) == sqsBatchEntries || size+n > q.maxSize {
			b.send(ctx)
			size = 0
		}
		if b.held(i) {
			continue
		}
		entry.Id = aws.String(strconv.Itoa(len(b.idx)))
		b.idx, b.entries, size = append(b.idx, i), append(b.entries, entry), size+n
	}
	b.send(ctx)
}

// sqsBatch gathers the entries of one SendMessageBatch to a queue.
type sqsBatch struct {
	p       *SQSPublisher
	q       *sqsQueue
	events  []Event
	errs    []error
	idx     []int // events[idx[j]] is entries[j]
	entries []types.SendMessageBatchRequestEntry
	// failed holds the FIFO groups with a failed event: their later events wait.
	failed map[string]bool
}

// held reports (and records) that event i waits because an earlier event of its FIFO group
// failed.
func (b *sqsBatch) held(i int) bool {
	e := &b.events[i]
	if b.q.fifo && b.failed[sqsGroupID(e)] {
		b.errs[i] = keyFailed(e.Topic, e.Key)
		return true
	}
	return false
}

func (b *sqsBatch) fail(i int, err error) {
	b.errs[i] = err
	if b.q.fifo {
		b.failed[sqsGroupID(&b.events[i])] = true
	}
}

// send sends the gathered entries, if any, and empties the batch. When SQS refuses the whole
// batch as invalid, its entries are sent one by one to find the culprit.
func (b *sqsBatch) send(ctx context.Context) {
	idx, entries := b.idx, b.entries
	b.idx, b.entries = nil, nil
	if len(idx) == 0 {
		return
	}
	out, err := b.p.client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(b.q.url), Entries: entries})
	if err != nil {
		err = b.p.classify(b.q, err)
		if errors.Is(err, ErrPermanent) && !errors.Is(err, ErrNoDestination) && len(idx) > 1 {
			for j, i := range idx {
				if !b.held(i) {
					entries[j].Id = aws.String("0")
					b.idx, b.entries = []int{i}, entries[j:j+1]
					b.send(ctx)
				}
			}
			return
		}
		for _, i := range idx {
			b.fail(i, err)
		}
		return
	}
	answered := make([]bool, len(idx))
	for _, s := range out.Successful {
		if j, err := strconv.Atoi(aws.ToString(s.Id)); err == nil && j >= 0 && j < len(idx) {
			answered[j] = true
		}
	}
	for _, f := range out.Failed {
		j, err := strconv.Atoi(aws.ToString(f.Id))
		if err != nil || j < 0 || j >= len(idx) {
			continue
		}
		answered[j] = true
		err = fmt.Errorf("SQS refused the message for queue %s: %s: %s", b.q.url, aws.ToString(f.Code), aws.ToString(f.Message))
		if f.SenderFault {
			err = &publishError{err: err, permanent: true}
		}
		b.fail(idx[j], err)
	}
	for j, ok := range answered {
		if !ok {
			b.fail(idx[j], fmt.Errorf("SQS did not answer for the message in its batch to queue %s", b.q.url))
		}
	}
}

// queue resolves and caches a queue's URL, kind and size limit.
func (p *SQSPublisher) queue(ctx context.Context, topic string) (*sqsQueue, error) {
	p.mu.Lock()
	q, ok := p.queues[topic]
	p.mu.Unlock()
	if ok {
		return q, nil
	}
	q = &sqsQueue{url: topic}
	name := topic[strings.LastIndexByte(topic, '/')+1:]
	if !strings.Contains(topic, "://") {
		out, err := p.client.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(topic)})
		if err != nil {
			return nil, p.classify(q, err)
		}
		q.url = aws.ToString(out.QueueUrl)
	}
	q.fifo = strings.HasSuffix(name, ".fifo")
	q.maxSize = sqsMaxSizeDefault
	// A producer allowed sqs:SendMessage alone still publishes, within SQS's default limit;
	// a missing queue shows in the first send.
	out, err := p.client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl: aws.String(q.url), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameMaximumMessageSize},
	})
	if err == nil {
		if n, err := strconv.Atoi(out.Attributes[string(types.QueueAttributeNameMaximumMessageSize)]); err == nil && n > 0 {
			q.maxSize = n
		}
	}
	p.mu.Lock()
	p.queues[topic] = q
	p.mu.Unlock()
	return q, nil
}

// classify wraps an SQS error with its class. A missing queue is forgotten, so that it is
// resolved again once someone creates it.
func (p *SQSPublisher) classify(q *sqsQueue, err error) error {
	wrapped := fmt.Errorf("error publishing to SQS queue %s: %w", q.url, err)
	switch sqsErrorCode(err) {
	case "QueueDoesNotExist", "NonExistentQueue":
		p.mu.Lock()
		for k, v := range p.queues {
			if v.url == q.url {
				delete(p.queues, k)
			}
		}
		p.mu.Unlock()
		return noDestination(wrapped)
	case "InvalidParameterValue", "InvalidMessageContents", "InvalidAttributeName", "InvalidAttributeValue",
		"BatchRequestTooLong", "TooManyEntriesInBatchRequest", "BatchEntryIdsNotDistinct", "UnsupportedOperation":
		return &publishError{err: wrapped, permanent: true}
	}
	return wrapped
}

// sqsErrorCode is the API error code of err, without the query protocol's prefix
// (AWS.SimpleQueueService.NonExistentQueue and QueueDoesNotExist are the same error).
func sqsErrorCode(err error) string {
	var api smithy.APIError
	if !errors.As(err, &api) {
		return ""
	}
	return strings.TrimPrefix(api.ErrorCode(), "AWS.SimpleQueueService.")
}

// sqsEntry is the batch entry of e and the size SQS counts for it (body and attributes), or
// why SQS would refuse it on every attempt.
func sqsEntry(e *Event, fifo bool) (types.SendMessageBatchRequestEntry, int, error) {
	body, encoded := sqsBody(e.Payload)
	attrs := attributes(e)
	if encoded {
		attrs[HeaderBodyEncoding] = "base64"
	}
	if len(attrs) > sqsMaxAttributes {
		return types.SendMessageBatchRequestEntry{}, 0, permanent("the event has %d headers with idemd's; SQS takes at most %d message attributes", len(attrs), sqsMaxAttributes)
	}
	entry := types.SendMessageBatchRequestEntry{
		MessageBody:       aws.String(body),
		MessageAttributes: make(map[string]types.MessageAttributeValue, len(attrs)),
	}
	n := len(body)
	for k, v := range attrs {
		if !sqsText(v) || !sqsText(k) {
			return types.SendMessageBatchRequestEntry{}, 0, permanent("header %q is not text SQS accepts", k)
		}
		n += len(k) + len("String") + len(v)
		entry.MessageAttributes[k] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
	}
	if fifo {
		entry.MessageGroupId = aws.String(sqsGroupID(e))
		entry.MessageDeduplicationId = aws.String(e.OperationID.String())
	}
	return entry, n, nil
}

// sqsBody is the payload as an SQS body: as it is when SQS takes it as text, else base64.
func sqsBody(payload []byte) (string, bool) {
	if sqsText(string(payload)) {
		return string(payload), false
	}
	return base64.StdEncoding.EncodeToString(payload), true
}

// sqsText reports whether s has only the characters SQS accepts in a body or an attribute:
// #x9, #xA, #xD, #x20 to #xD7FF, #xE000 to #xFFFD, #x10000 to #x10FFFF, in valid UTF-8.
func sqsText(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		switch {
		case r == 0x9 || r == 0xA || r == 0xD:
		case r >= 0x20 && r <= 0xD7FF, r >= 0xE000 && r <= 0xFFFD, r >= 0x10000 && r <= 0x10FFFF:
		default:
			return false
		}
	}
	return true
}

// sqsGroupID is the MessageGroupId of e on a FIFO queue: its key, the pipeline when it has
// none, or the key's SHA-256 when SQS would refuse the key (more than 128 characters, or
// characters other than letters, digits and punctuation). Events of one key share a group
// either way.
func sqsGroupID(e *Event) string {
	key := string(e.Key)
	if key == "" {
		key = e.Pipeline
	}
	ok := len(key) <= sqsMaxGroupIDLength
	for i := 0; ok && i < len(key); i++ {
		ok = key[i] > 0x20 && key[i] < 0x7f
	}
	if ok {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return "sha256-" + hex.EncodeToString(sum[:])
}

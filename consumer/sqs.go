package consumer

import (
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemd/idemd/outbox"
)

// Defaults of sqsSourceConfig.
const (
	sqsVisibilityDefault   = 30 * time.Second
	sqsWaitTimeDefault     = 20 * time.Second
	sqsMaxExtensionDefault = 10 * time.Minute
	sqsRetryDelayDefault   = time.Second
	sqsReceiveMax          = 10 // SQS's own limit per ReceiveMessage
)

// sqsSourceConfig configures an sqsSource.
type sqsSourceConfig struct {
	// Queue is a queue name, resolved with GetQueueUrl, or a queue URL. Required.
	Queue string
	// Visibility is the lease of a received message; while the message is held, the source
	// extends it by as much once a third of it has passed (a heartbeat every Visibility/6).
	// Whole seconds. Defaults to 30 s.
	Visibility time.Duration
	// WaitTime is how long one ReceiveMessage long-polls for a first message. Whole
	// seconds, at most 20. Defaults to 20 s.
	WaitTime time.Duration
	// MaxExtension bounds how long a held message's visibility is extended; after it the
	// message is redelivered. Defaults to 10 minutes.
	MaxExtension time.Duration
	// RetryDelay is when a released message becomes visible again. Whole seconds.
	// Defaults to 1 s: a transient failure is not retried at once, and goaws keeps the
	// group of a FIFO message released with visibility 0 locked.
	RetryDelay time.Duration
}

// sqsSource receives an SQS queue with long-polling ReceiveMessage calls. It keeps every
// message it handed out invisible (ChangeMessageVisibility by Visibility once a third of its
// current lease has passed, a heartbeat every Visibility/6) until Ack deletes it, Release
// gives it back, or MaxExtension passes. A message acknowledged within a third of its lease
// is never extended. Receive may be called
// from several goroutines: each call is one ReceiveMessage.
type sqsSource struct {
	client SQSClient
	cfg    sqsSourceConfig
	url    string
	fifo   bool

	mu   sync.Mutex
	held map[string]*sqsHeld // by receipt handle
	// beat is held by a heartbeat round and by Release, so that a round that read a message
	// as held cannot extend it after Release gave it back.
	beat sync.Mutex

	stop      chan struct{}
	stopped   chan struct{}
	closeOnce sync.Once
}

// sqsHeld is a message the source handed out: leased since leased (its receipt or its last
// extension).
type sqsHeld struct {
	msg    *brokerMessage
	leased time.Time
}

// newSQSSource resolves the queue and starts the visibility heartbeat; call Close to stop.
func newSQSSource(ctx context.Context, client SQSClient, cfg sqsSourceConfig) (*sqsSource, error) {
	if client == nil {
		return nil, errors.New("sqs source: client is required")
	}
	cfg.Visibility = cmp.Or(cfg.Visibility, sqsVisibilityDefault)
	cfg.WaitTime = cmp.Or(cfg.WaitTime, sqsWaitTimeDefault)
	cfg.MaxExtension = cmp.Or(cfg.MaxExtension, sqsMaxExtensionDefault)
	cfg.RetryDelay = cmp.Or(cfg.RetryDelay, sqsRetryDelayDefault)
	switch {
	case cfg.Queue == "":
		return nil, errors.New("sqs source: queue is required")
	case cfg.Visibility < time.Second || cfg.Visibility%time.Second != 0:
		return nil, fmt.Errorf("sqs source: Visibility must be whole seconds, at least 1, got %s", cfg.Visibility)
	case cfg.WaitTime < 0 || cfg.WaitTime > 20*time.Second || cfg.WaitTime%time.Second != 0:
		return nil, fmt.Errorf("sqs source: WaitTime must be whole seconds from 0 to 20, got %s", cfg.WaitTime)
	case cfg.RetryDelay < 0 || cfg.RetryDelay%time.Second != 0:
		return nil, fmt.Errorf("sqs source: RetryDelay must be whole seconds, got %s", cfg.RetryDelay)
	}
	url := cfg.Queue
	if !strings.Contains(url, "://") {
		out, err := client.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(cfg.Queue)})
		if err != nil {
			return nil, fmt.Errorf("sqs source: error resolving queue %s: %w", cfg.Queue, err)
		}
		url = aws.ToString(out.QueueUrl)
	}
	s := &sqsSource{
		client: client, cfg: cfg, url: url, fifo: strings.HasSuffix(url, ".fifo"),
		held: map[string]*sqsHeld{}, stop: make(chan struct{}), stopped: make(chan struct{}),
	}
	go s.heartbeat()
	return s, nil
}

// Receive makes ReceiveMessage calls until one returns messages (at most 10).
func (s *sqsSource) Receive(ctx context.Context) ([]*brokerMessage, error) {
	for {
		out, err := s.client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl:                    aws.String(s.url),
			MaxNumberOfMessages:         sqsReceiveMax,
			WaitTimeSeconds:             int32(s.cfg.WaitTime / time.Second),
			VisibilityTimeout:           int32(s.cfg.Visibility / time.Second),
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
		})
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("error receiving from SQS queue %s: %w", s.url, err)
		}
		if len(out.Messages) == 0 {
			continue
		}
		now := time.Now()
		msgs := make([]*brokerMessage, len(out.Messages))
		s.mu.Lock()
		for i := range out.Messages {
			msgs[i] = s.fromSQS(&out.Messages[i], now)
			s.held[aws.ToString(out.Messages[i].ReceiptHandle)] = &sqsHeld{msg: msgs[i], leased: now}
		}
		s.mu.Unlock()
		return msgs, nil
	}
}

func (s *sqsSource) fromSQS(m *types.Message, now time.Time) *brokerMessage {
	b := &brokerMessage{
		ID: aws.ToString(m.MessageId), Ordered: s.fifo, Lane: m.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)],
		Body: []byte(aws.ToString(m.Body)), Attributes: make(map[string]string, len(m.MessageAttributes)),
		ReceivedAt: now, handle: aws.ToString(m.ReceiptHandle),
	}
	for k, v := range m.MessageAttributes {
		if v.StringValue != nil { // String and Number; Binary attributes are left out
			b.Attributes[k] = *v.StringValue
		}
	}
	if b.Attributes[outbox.HeaderBodyEncoding] == "base64" {
		if body, err := base64.StdEncoding.DecodeString(aws.ToString(m.Body)); err == nil {
			b.Body = body
		}
	}
	if n, err := strconv.Atoi(m.Attributes[string(types.MessageSystemAttributeNameApproximateReceiveCount)]); err == nil {
		b.DeliveryAttempt = n
	}
	if ms, err := strconv.ParseInt(m.Attributes[string(types.MessageSystemAttributeNameSentTimestamp)], 10, 64); err == nil {
		b.PublishTime = time.UnixMilli(ms)
	}
	return b
}

// forget stops extending msgs and returns their receipt handles.
func (s *sqsSource) forget(msgs []*brokerMessage) []string {
	handles := make([]string, len(msgs))
	s.mu.Lock()
	for i, m := range msgs {
		handles[i] = m.handle.(string)
		delete(s.held, handles[i])
	}
	s.mu.Unlock()
	return handles
}

// Ack deletes msgs with DeleteMessageBatch, ten at a time. A message whose lease ran out
// (MaxExtension, or a heartbeat that failed) may have been redelivered: its delete fails,
// and the redelivery is deduplicated by its id.
func (s *sqsSource) Ack(ctx context.Context, msgs []*brokerMessage) error {
	handles := s.forget(msgs)
	var errs []error
	for start := 0; start < len(handles); start += sqsReceiveMax {
		chunk := handles[start:min(start+sqsReceiveMax, len(handles))]
		entries := make([]types.DeleteMessageBatchRequestEntry, len(chunk))
		for i, h := range chunk {
			entries[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: aws.String(h)}
		}
		out, err := s.client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(s.url), Entries: entries})
		if err != nil {
			errs = append(errs, fmt.Errorf("error deleting %d messages from SQS queue %s: %w", len(chunk), s.url, err))
			continue
		}
		for _, f := range out.Failed {
			errs = append(errs, fmt.Errorf("error deleting a message from SQS queue %s: %s: %s", s.url, aws.ToString(f.Code), aws.ToString(f.Message)))
		}
	}
	return errors.Join(errs...)
}

// Release makes msgs visible again after RetryDelay. If that fails, they come back when
// their visibility ends, as the heartbeat no longer extends them.
func (s *sqsSource) Release(ctx context.Context, msgs []*brokerMessage) error {
	s.beat.Lock()
	defer s.beat.Unlock()
	_, err := s.setVisibility(ctx, s.forget(msgs), s.cfg.RetryDelay)
	return err
}

// setVisibility sets the visibility of the messages of handles to d; failed marks the
// handles whose call failed.
func (s *sqsSource) setVisibility(ctx context.Context, handles []string, d time.Duration) (failed []bool, err error) {
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
		sem  = make(chan struct{}, 8)
	)
	failed = make([]bool, len(handles))
	// goaws has no ChangeMessageVisibilityBatch; one call per message, eight at a time.
	for i, h := range handles {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			_, err := s.client.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
				QueueUrl: aws.String(s.url), ReceiptHandle: aws.String(h), VisibilityTimeout: int32(d / time.Second),
			})
			if err != nil {
				mu.Lock()
				failed[i] = true
				errs = append(errs, fmt.Errorf("error changing a message's visibility on SQS queue %s: %w", s.url, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return failed, errors.Join(errs...)
}

// heartbeat extends, every Visibility/6, the visibility of the held messages leased a third
// of Visibility ago or more, and forgets those held longer than MaxExtension. A message is
// extended with more than half its lease left, and a failed extension is tried again at the
// next beat, with more than a sixth left (a beat's calls take at most Visibility/3).
func (s *sqsSource) heartbeat() {
	defer close(s.stopped)
	t := time.NewTicker(s.cfg.Visibility / 6)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		s.beat.Lock()
		now := time.Now()
		var (
			extend []string
			due    []*sqsHeld
		)
		s.mu.Lock()
		for h, m := range s.held {
			switch {
			case now.Sub(m.msg.ReceivedAt) >= s.cfg.MaxExtension:
				delete(s.held, h)
			case now.Sub(m.leased) >= s.cfg.Visibility/3:
				extend, due = append(extend, h), append(due, m)
			}
		}
		s.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Visibility/3)
		// A failure is retried at the next beat.
		failed, _ := s.setVisibility(ctx, extend, s.cfg.Visibility)
		cancel()
		s.mu.Lock()
		for i, m := range due {
			if !failed[i] {
				m.leased = now
			}
		}
		s.mu.Unlock()
		s.beat.Unlock()
	}
}

// Close stops the heartbeat and releases the messages still held.
func (s *sqsSource) Close() error {
	var err error
	s.closeOnce.Do(func() {
		close(s.stop)
		<-s.stopped
		s.mu.Lock()
		held := make([]*brokerMessage, 0, len(s.held))
		for _, m := range s.held {
			held = append(held, m.msg)
		}
		s.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err = s.Release(ctx, held)
	})
	return err
}

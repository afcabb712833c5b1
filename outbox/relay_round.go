package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/segmentio/kafka-go"

	"github.com/idemd/idemd/internal/metrics"
	"github.com/idemd/idemd/internal/pgarray"
)

// relayRoundBytes bounds the estimated size of one round's rows, whatever their
// destination. Kafka refuses a record batch above the broker's message.max.bytes (1048588
// by default) for good, so a round of BatchSize large rows bound for one partition would
// fail on every retry and stall the outbox; and a round the writer had to split into
// several batches per partition could land a later batch while an earlier one failed,
// reordering a key. One round below this bound makes one batch per partition that the
// default broker accepts (the relay's Writer for a round holds it whole: tieredWriter).
// Pub/Sub and SQS batch within their own limits, but the bound also keeps what a round
// holds in memory small, and below the Pub/Sub client's buffer (BufferedByteLimit, 100 MB),
// beyond which it refuses publishes until the round ends. A row larger than the bound still
// makes a round of its own.
const relayRoundBytes = 1_000_000

// eventSize over-estimates the encoded size of e's record (or message) with the three
// headers the relay adds.
func eventSize(e *Event) int {
	n := 32 + len(e.Key) + len(e.Payload) + 3*16 + len(HeaderOperationID) + 36 +
		len(HeaderCausationID) + len(e.CausationID) + len(HeaderPipeline) + len(e.Pipeline)
	for k, v := range e.Headers {
		n += 16 + len(k) + len(v)
	}
	return n
}

// round is what one publishing round did (and the value of the Round test signal).
type round struct {
	// Published rows were acknowledged by their broker and marked.
	Published int
	// DeadLettered rows were moved to dead_letters: refused for good by their broker (too
	// large, invalid), or their destination kept failing for longer than MaxFailingFor.
	DeadLettered int
	// Failed are the destinations (outbox topics: a Kafka topic, "pubsub:…", "sqs:…")
	// whose publish failed in this round; their rows wait for a retry.
	Failed []string
	// Held are the destinations left out of this round because they wait for a retry.
	Held []string
	// More reports that rows may be left beyond the round's bounds (BatchSize, bytes).
	More bool
	// FromHandoff: the round published rows handed over by this process (Handoff) instead
	// of reading the table.
	FromHandoff bool
	// reachedHandoff: the round read the table from its head up to the rows waiting in the
	// Handoff, so that the relay may take those next.
	reachedHandoff bool
}

// clean reports whether the round published everything that was unpublished when it
// started: it read the table, and left no row beyond its bounds or behind a failing
// destination.
func (rd *round) clean() bool {
	return !rd.More && len(rd.Failed) == 0 && len(rd.Held) == 0 && !rd.FromHandoff
}

// batch is the rows of one destination in a round, in id order, and the outlet that
// publishes them. events[i] is row ids[i], its Topic the name its broker knows.
type batch struct {
	dest   string // the rows' topic column: a Kafka topic, "pubsub:…", "sqs:…"
	kind   string // DestinationKafka, DestinationPubSub, DestinationSQS
	name   string // the topic or queue, as its broker knows it
	out    outlet
	ids    []int64
	events []Event
	errs   []error // the outcome of the round's publish, one per row
}

// pick returns the batch of b's rows at idx, in order.
func (b *batch) pick(idx []int) *batch {
	p := &batch{dest: b.dest, kind: b.kind, name: b.name, out: b.out, ids: make([]int64, len(idx)), events: make([]Event, len(idx))}
	for j, i := range idx {
		p.ids[j], p.events[j] = b.ids[i], b.events[i]
	}
	return p
}

// from returns the batch of b's rows from i on.
func (b *batch) from(i int) *batch {
	return &batch{dest: b.dest, kind: b.kind, name: b.name, out: b.out, ids: b.ids[i:], events: b.events[i:]}
}

// verdict is how the relay takes a row's failure.
type verdict int

const (
	// retryLater: the destination failed (an outage, a missing topic or queue, a refused
	// authorization); the row waits, in order, behind the destination's retry.
	retryLater verdict = iota
	// refused: the broker refuses this row for good (too large, invalid): it is
	// dead-lettered and the destination goes on.
	refused
	// refusedAmongOthers: the broker refused a group of rows for good, one of them the
	// culprit: the rows are sent again one at a time to find it.
	refusedAmongOthers
	// heldBehind: the row was not sent because an earlier row of its key failed; it follows
	// that row.
	heldBehind
)

// outlet is what publishes a destination's rows: Kafka's writer or a broker's Publisher.
type outlet interface {
	// publish sends b's events, all of one destination, and returns one outcome per event:
	// nil when the broker acknowledged it.
	publish(ctx context.Context, b *batch) []error
	// verdict classifies the failure err of a row; alone says the row was sent by itself.
	verdict(err error, alone bool) verdict
}

// relayReadAheadRounds bounds how many rounds in a row are read ahead (see ahead); the
// round after them reads from the head of the outbox, and picks up the rows of transactions
// that committed late, below the ids already read.
const relayReadAheadRounds = 4

// ahead is the next round's rows, read while the current round's were being published,
// when the relay is behind (the current round was full). It reads only rows after the
// current round's last id, so it cannot return a row the current round is publishing; the
// rows of a transaction that committed late, below that id, wait for the next full read,
// unless one of them has the destination and key of a row read ahead: then the rows read
// ahead are dropped and the round reads from the floor (passedOver), so that a key's rows
// keep their order. It is used only while no destination is failing: a failing
// destination's later rows must never be read past its earlier ones.
type ahead struct {
	after   int64 // the rows are after this id
	batches []*batch
	more    bool
	last    int64
	err     error
	done    chan struct{}
}

// readAhead starts reading the rows after id after, for the next round.
func (r *Relay) readAhead(ctx context.Context, after int64) {
	a := &ahead{after: after, done: make(chan struct{})}
	go func() {
		defer close(a.done)
		if r.signals.ReadingAhead != nil {
			r.signals.ReadingAhead()
		}
		a.batches, a.more, a.last, a.err = r.selectRound(ctx, nil, after)
	}()
	r.next = a
}

// takeAhead returns the rows read ahead for this round, if any and still usable, and the
// largest id among them.
func (r *Relay) takeAhead(ctx context.Context) (batches []*batch, more bool, last int64, ok bool) {
	a := r.next
	if a == nil {
		return nil, false, 0, false
	}
	r.next = nil
	<-a.done
	if a.err != nil || len(r.failing) > 0 {
		// A destination failed in the round before: read from the head again.
		return nil, false, 0, false
	}
	if r.passedOver(ctx, a) {
		// A row of one of these keys committed late below them: read from the floor, which
		// publishes it first.
		r.aheadsDropped.Add(1)
		return nil, false, 0, false
	}
	return a.batches, a.more, a.last, true
}

// passedOver reports whether an unpublished row at or below a.after, which a read ahead
// does not read (a transaction that committed late), has the destination and key of one
// of a's rows. Its key's later rows may be among a's, written by a transaction that ran
// after it: publishing them first would break the key's order. The question is asked once
// the round before committed, so its own rows are gone; a row committed after a's read
// only makes the answer yes without need. Rows without a key promise no order. An error
// counts as yes: the round reads from the floor instead.
func (r *Relay) passedOver(ctx context.Context, a *ahead) bool {
	var (
		dests []string
		keys  [][]byte
		seen  = map[string]bool{}
	)
	for _, b := range a.batches {
		for _, e := range b.events {
			if e.Key == nil {
				continue
			}
			k := b.dest + "\x00" + string(e.Key)
			if !seen[k] {
				seen[k] = true
				dests, keys = append(dests, b.dest), append(keys, e.Key)
			}
		}
	}
	if len(keys) == 0 {
		return false
	}
	var found bool
	err := queryRowByIndex(ctx, r.pool, r.passedOverSQL, []any{a.after, pgarray.Text(dests), r.floor, pgarray.Bytes(keys)}, &found)
	return err != nil || found
}

// dropAhead waits for a read ahead in flight and forgets it.
func (r *Relay) dropAhead() {
	if r.next != nil {
		<-r.next.done
		r.next = nil
	}
}

// publishRound publishes up to BatchSize unpublished rows in id order, within
// relayRoundBytes, leaving out the destinations that wait for a retry. Each destination is
// published separately (concurrently), so that one failing destination holds back only
// its own rows. While a full round is being published, the next one is read (ahead).
func (r *Relay) publishRound(ctx context.Context) (*round, error) {
	rd := &round{Held: r.heldTopics()}
	batches, more, last, readAhead := r.takeAhead(ctx)
	if readAhead {
		r.readAheads.Add(1)
		r.sinceFull++
	} else {
		var err error
		batches, more, last, err = r.selectRound(ctx, rd.Held, 0)
		if err != nil {
			return rd, err
		}
		r.sinceFull = 0
	}
	// A round read ahead may have passed rows that committed late: it is never the clean
	// round that releases Drain; a full read follows.
	rd.More = more || readAhead
	// A full read that reached the rows handed over has every other row below them.
	rd.reachedHandoff = !readAhead && len(rd.Held) == 0 && r.cfg.Handoff != nil && r.cfg.Handoff.reached(last)
	if len(batches) == 0 {
		r.forgetIdleFailures(batches, rd)
		return rd, nil
	}
	if more && !rd.reachedHandoff && len(rd.Held) == 0 && len(r.failing) == 0 && r.sinceFull < relayReadAheadRounds {
		r.readAhead(ctx, last)
	}

	r.sendAll(ctx, batches)
	return r.finish(ctx, batches, rd)
}

// sendAll publishes each destination's rows, concurrently; their outcomes are in b.errs.
func (r *Relay) sendAll(ctx context.Context, batches []*batch) {
	var wg sync.WaitGroup
	for _, b := range batches {
		wg.Go(func() { b.errs = r.send(ctx, b) })
	}
	wg.Wait()
}

// finish takes the outcome of a round's publishes: it settles each destination's rows
// (settle) and marks the ones their brokers have.
func (r *Relay) finish(ctx context.Context, batches []*batch, rd *round) (*round, error) {
	var (
		published []int64
		perDest   = map[string]int{}
	)
	for _, b := range batches {
		ids, err := r.settle(ctx, b, b.errs, rd)
		published = append(published, ids...)
		perDest[b.dest] += len(ids)
		if err != nil {
			return rd, err
		}
	}
	r.forgetIdleFailures(batches, rd)
	if len(published) == 0 {
		return rd, nil
	}
	if r.cfg.AfterPublish != nil {
		if err := r.cfg.AfterPublish(published); err != nil {
			return rd, hookError{err}
		}
	}
	if err := r.mark(ctx, published); err != nil {
		return rd, err
	}
	r.counted(rd, len(published), perDest)
	return rd, nil
}

// counted counts n rows marked published, perDest[dest] of them per destination.
func (r *Relay) counted(rd *round, n int, perDest map[string]int) {
	r.published.Add(int64(n))
	r.pubRounds.Add(1)
	rd.Published += n
	for dest, k := range perDest {
		if k > 0 {
			metrics.OutboxPublished.WithLabelValues(dest).Add(float64(k))
		}
	}
	r.log.WithField("count", n).Debug("published outbox rows")
}

// settle takes the outcome errs of publishing b: it returns the rows the broker has, to be
// marked; dead-letters the rows refused for good; sends again the rows held behind those;
// and leaves every other row waiting, in order, behind the destination's retry.
func (r *Relay) settle(ctx context.Context, b *batch, errs []error, rd *round) (published []int64, err error) {
	var (
		failed, again, dead []int
		cause               error // the first failure that is not a held row's
		persistent          = true
		alone               bool // the rows sent again go one at a time
	)
	for i, e := range errs {
		if e == nil {
			published = append(published, b.ids[i])
			continue
		}
		if ctx.Err() != nil {
			// Cut short by shutdown: what the broker has is marked; the rest is published
			// by the next round or the next leader.
			continue
		}
		switch b.out.verdict(e, len(errs) == 1) {
		case refused:
			dead = append(dead, i)
		case refusedAmongOthers:
			again, alone = append(again, i), true
		case heldBehind:
			again = append(again, i)
		default:
			failed = append(failed, i)
			if cause == nil {
				cause = e
			}
			persistent = persistent && persistentError(e)
		}
	}
	if ctx.Err() != nil {
		return published, nil
	}
	if len(dead) > 0 {
		if err := r.refuse(ctx, b.pick(dead), pickErrs(errs, dead), rd); err != nil {
			return published, err
		}
	}
	if len(failed) == 0 && len(again) > 0 && len(dead) == 0 && !alone {
		// Held behind a row that did not fail in this call (which a Publisher does not
		// do): wait for the retry rather than loop.
		failed, again, cause, persistent = again, nil, errs[again[0]], false
	}
	if len(failed) > 0 {
		// Every row not published waits, in order: a key never overtakes itself.
		rest := b.pick(merge(failed, again))
		return published, r.topicFailed(ctx, rest, cause, persistent, rd)
	}
	if len(again) == 0 {
		r.topicRecovered(b.dest)
		return published, nil
	}
	var more []int64
	if alone {
		more, err = r.publishOneByOne(ctx, b.pick(again), rd)
	} else {
		sub := b.pick(again)
		more, err = r.settle(ctx, sub, r.send(ctx, sub), rd)
	}
	return append(published, more...), err
}

// publishOneByOne publishes the rows of a batch the broker refused as a whole (Kafka: a
// record batch too large) one at a time, in id order, dead-lettering the ones refused
// alone. Another error makes the rest of the rows wait behind the destination's retry.
func (r *Relay) publishOneByOne(ctx context.Context, b *batch, rd *round) ([]int64, error) {
	var published []int64
	for i := range b.ids {
		one := b.pick([]int{i})
		err := r.send(ctx, one)[0]
		switch {
		case err == nil:
			published = append(published, b.ids[i])
		case ctx.Err() != nil:
			return published, nil
		case b.out.verdict(err, true) == refused:
			if err := r.refuse(ctx, one, []error{err}, rd); err != nil {
				return published, err
			}
		default:
			return published, r.topicFailed(ctx, b.from(i), err, persistentError(err), rd)
		}
	}
	r.topicRecovered(b.dest)
	return published, nil
}

// refuse dead-letters the rows of b that their broker refuses for good, errs[i] being row
// i's refusal.
func (r *Relay) refuse(ctx context.Context, b *batch, errs []error, rd *round) error {
	reasons := make([]string, len(b.ids))
	for i, e := range errs {
		reasons[i] = fmt.Sprintf("%s refuses the event for good (%d bytes of payload): %v", brokerName(b.kind), len(b.events[i].Payload), e)
		r.log.WithError(e).WithField("topic", b.dest).WithField("bytes", len(b.events[i].Payload)).
			Error("outbox row refused by its broker: moved to dead_letters so that the outbox goes on")
	}
	if err := r.deadLetter(ctx, b, reasons, 1); err != nil {
		return err
	}
	rd.DeadLettered += len(b.ids)
	return nil
}

func pickErrs(errs []error, idx []int) []error {
	out := make([]error, len(idx))
	for j, i := range idx {
		out[j] = errs[i]
	}
	return out
}

// merge merges two increasing lists of indexes.
func merge(a, b []int) []int {
	out := make([]int, 0, len(a)+len(b))
	for len(a) > 0 || len(b) > 0 {
		if len(b) == 0 || (len(a) > 0 && a[0] < b[0]) {
			out, a = append(out, a[0]), a[1:]
		} else {
			out, b = append(out, b[0]), b[1:]
		}
	}
	return out
}

// selectRound reads the round's rows after id after (0: from the head), grouped by
// destination in the order their first row comes. more reports that rows may be left beyond
// the round's bounds; last is the largest id read.
func (r *Relay) selectRound(ctx context.Context, held []string, after int64) (batches []*batch, more bool, last int64, err error) {
	if held == nil {
		held = []string{}
	}
	var (
		rows pgx.Rows
		done func() error
	)
	if after > 0 {
		// Read ahead: only while no destination is held, so held is empty.
		rows, done, err = queryByIndex(ctx, r.pool, r.selectAfterSQL, r.cfg.BatchSize, after)
	} else {
		rows, done, err = queryByIndex(ctx, r.pool, r.selectSQL, r.cfg.BatchSize, held, r.floor)
	}
	if err != nil {
		return nil, false, 0, fmt.Errorf("error reading outbox: %w", err)
	}
	defer done() //nolint:errcheck // the rows' own error is checked below
	defer rows.Close()
	var (
		g     grouping
		n     int
		bytes int
		sc    rowScanner
	)
	defer func() { r.lastRows.Store(int64(n)) }()
	for rows.Next() {
		id, topic, e, err := sc.scan(rows)
		if err != nil {
			return nil, false, 0, fmt.Errorf("error reading outbox: %w", err)
		}
		if bytes += eventSize(&e); bytes > relayRoundBytes && n > 0 {
			// The rest waits for the next round, which starts at once.
			more = true
			break
		}
		// Most rounds have one destination, and as many rows as the last.
		g.add(r, topic, id, e, min(int(r.lastRows.Load()), r.cfg.BatchSize))
		last = id
		n++
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, false, 0, fmt.Errorf("error reading outbox: %w", err)
	}
	return g.batches, more || n == r.cfg.BatchSize, last, nil
}

// rowColumns are the columns of an outbox row the relay publishes, as rowScanner reads them.
const rowColumns = `id, operation_id, pipeline, causation_id, topic, key, payload, headers`

// rowScanner reads outbox rows of rowColumns, with one set of scan targets for every row
// (each of them escapes to Scan).
type rowScanner struct {
	id      int64
	topic   string
	e       Event
	headers []byte
	// A uuid.UUID scans as an sql.Scanner: pgx formats the binary uuid as text, which the
	// Scanner parses back; pgtype.UUID takes the 16 bytes.
	op pgtype.UUID
}

// scan reads the current row: its id, its destination (the topic column) and its event.
func (s *rowScanner) scan(rows pgx.Rows) (id int64, topic string, e Event, err error) {
	s.e, s.headers = Event{}, nil
	if err := rows.Scan(&s.id, &s.op, &s.e.Pipeline, &s.e.CausationID, &s.topic, &s.e.Key, &s.e.Payload, &s.headers); err != nil {
		return 0, "", Event{}, err
	}
	s.e.OperationID = s.op.Bytes // the column is NOT NULL
	if s.headers != nil {
		if s.e.Headers, err = decodeHeaders(s.headers); err != nil {
			return 0, "", Event{}, fmt.Errorf("the headers of row %d: %w", s.id, err)
		}
	}
	return s.id, s.topic, s.e, nil
}

// grouping sorts a round's rows into one batch per destination, in the order their first
// row comes.
type grouping struct {
	byDest  map[string]*batch
	batches []*batch
}

// add adds row id, event e of destination topic; the first batch gets room for hint rows.
func (g *grouping) add(r *Relay, topic string, id int64, e Event, hint int) {
	b := g.byDest[topic]
	if b == nil {
		if g.byDest == nil {
			g.byDest = map[string]*batch{}
		}
		b = &batch{dest: topic}
		if len(g.batches) == 0 {
			b.ids, b.events = make([]int64, 0, hint), make([]Event, 0, hint)
		}
		b.kind, b.name = ParseDestination(topic)
		b.out = r.outlets[b.kind]
		g.byDest[topic] = b
		g.batches = append(g.batches, b)
	}
	e.Topic = b.name
	b.ids, b.events = append(b.ids, id), append(b.events, e)
}

// mark records rows as published. The broker has them: they are marked even if ctx is
// ending, or they would be sent twice.
func (r *Relay) mark(ctx context.Context, ids []int64) error {
	sql, args := r.markIDs.forIDs(ids)
	if err := execByIndex(context.WithoutCancel(ctx), r.pool, sql, args...); err != nil {
		return fmt.Errorf("error marking %d outbox rows published: %w", len(ids), err)
	}
	r.remember(ids)
	return nil
}

// kafkaOutlet publishes to Kafka with the relay's writer.
type kafkaOutlet struct{ w Writer }

// kafkaRound is the records of one publish and their headers' backing arrays, kept for the
// next publish when the relay's own writer (tieredWriter) took them: a round's records
// were a twentieth of the bytes the consumer's process allocated (BENCHMARKS.md, phase
// 36). A kafka-go Writer that is not Async has let go of a call's records once the call
// returned without an error: every batch it made of them is done. After an error it may
// not be (the context ended while batches were in flight), and a writer given in
// RelayConfig.Writer may keep what it is given: those records are left to the collector.
type kafkaRound struct {
	msgs []kafka.Message
	hs   []kafka.Header
	vals []byte
}

var kafkaRounds = sync.Pool{New: func() any { return new(kafkaRound) }}

// kafkaRoundMax bounds the header values' bytes of a kept kafkaRound, and
// relayHandoffRounds × RelayBatchSizeDefault its records: a round of many or large events
// must not pin its memory.
const kafkaRoundMax = 1 << 20

// put keeps kr's arrays for the next round, emptied so that they pin no event's bytes.
func (kr *kafkaRound) put() {
	if cap(kr.vals) > kafkaRoundMax || cap(kr.msgs) > relayHandoffRounds*RelayBatchSizeDefault {
		return
	}
	clear(kr.msgs)
	clear(kr.hs)
	kr.msgs, kr.hs, kr.vals = kr.msgs[:0], kr.hs[:0], kr.vals[:0]
	kafkaRounds.Put(kr)
}

func (o kafkaOutlet) publish(ctx context.Context, b *batch) []error {
	errs := make([]error, len(b.events))
	if o.w == nil {
		for i := range errs {
			errs[i] = errNoClient(DestinationKafka)
		}
		return errs
	}
	var nh, nb int
	for i := range b.events {
		n, bytes := headersSize(&b.events[i])
		nh, nb = nh+n, nb+bytes
	}
	_, keep := o.w.(*tieredWriter)
	kr := &kafkaRound{}
	if keep {
		kr = kafkaRounds.Get().(*kafkaRound)
	}
	msgs := slices.Grow(kr.msgs[:0], len(b.events))[:len(b.events)]
	hs, vals := slices.Grow(kr.hs[:0], nh), slices.Grow(kr.vals[:0], nb)
	for i := range b.events {
		e := &b.events[i]
		start := len(hs)
		hs, vals = recordHeaders(hs, vals, e.OperationID, e.CausationID, e.Pipeline, e.Headers)
		msgs[i] = kafka.Message{Topic: e.Topic, Key: e.Key, Value: e.Payload, Headers: hs[start:len(hs):len(hs)]}
	}
	err := o.w.WriteMessages(ctx, msgs...)
	if err == nil {
		if keep {
			kr.msgs, kr.hs, kr.vals = msgs, hs, vals
			kr.put()
		}
		return errs
	}
	// The writer reports one error per record (kafka.WriteErrors) when some partitions
	// took theirs.
	var we kafka.WriteErrors
	if errors.As(err, &we) && len(we) == len(errs) {
		copy(errs, we)
		return errs
	}
	for i := range errs {
		errs[i] = err
	}
	return errs
}

func (kafkaOutlet) verdict(err error, alone bool) verdict {
	switch {
	case !errors.Is(err, kafka.MessageSizeTooLarge):
		return retryLater
	case alone:
		return refused
	default:
		// Kafka refuses a record batch as a whole: find the record it will never take.
		return refusedAmongOthers
	}
}

// brokerOutlet publishes to Pub/Sub or SQS with a Publisher (nil: none was configured).
type brokerOutlet struct {
	kind string
	p    Publisher
}

func (o brokerOutlet) publish(ctx context.Context, b *batch) []error {
	if o.p == nil {
		errs := make([]error, len(b.events))
		for i := range errs {
			errs[i] = errNoClient(o.kind)
		}
		return errs
	}
	return o.p.Publish(ctx, b.events)
}

func (brokerOutlet) verdict(err error, _ bool) verdict {
	switch {
	case heldBack(err):
		return heldBehind
	case errors.Is(err, ErrNoDestination):
		// An operator can create the topic or queue: wait for it, up to MaxFailingFor.
		return retryLater
	case errors.Is(err, ErrPermanent):
		// The Publisher has found the culprit itself.
		return refused
	}
	return retryLater
}

// errNoClient is the failure of an event whose kind of destination the relay has no
// client for.
func errNoClient(kind string) error {
	switch kind {
	case DestinationPubSub:
		return errors.New("the relay has no Pub/Sub client (RelayConfig.PubSub): the daemon makes one when a pipeline publishes to Pub/Sub, from PUBSUB_PROJECT_ID or GOOGLE_CLOUD_PROJECT")
	case DestinationSQS:
		return errors.New("the relay has no SQS client (RelayConfig.SQS): the daemon makes one when a pipeline publishes to SQS, from AWS_REGION and the AWS credential chain")
	}
	return errors.New("the relay has no Kafka client: set IDEMD_KAFKA_BROKERS (RelayConfig.Brokers)")
}

// brokerName names a kind of destination for people.
func brokerName(kind string) string {
	switch kind {
	case DestinationPubSub:
		return "Pub/Sub"
	case DestinationSQS:
		return "SQS"
	}
	return "Kafka"
}

// opID is e's operation id as text, for letters and spans.
func opID(e *Event) string {
	if e.OperationID == uuid.Nil {
		return ""
	}
	return e.OperationID.String()
}

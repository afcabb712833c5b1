package config

import (
	"cmp"
	"fmt"
	"strings"
	"time"

	"github.com/idemd/idemd/consumer"
	"github.com/idemd/idemd/outbox"
	"github.com/idemd/idemd/pipeline"
	"github.com/idemd/idemd/receiver"
)

// Warnings lists what the file allows but probably should not: a webhook source whose
// retention (the default when unset) is shorter than its sender's retry horizon
// (receiver.RetryHorizons, SPEC 3.2), so that a late retry would find its record gone and
// be applied again; a target with a key on a standard SQS queue, which keeps no order.
// Each is an *Error naming the file, line, pipeline and field.
func (f *File) Warnings() []error {
	var out []error
	for _, s := range f.Sources {
		horizon, ok := receiver.RetryHorizons[s.Verify.Scheme]
		if !ok || s.Idempotency != nil {
			continue
		}
		retention := cmp.Or(s.Retention, pipeline.RetentionDefault)
		if retention < horizon {
			out = append(out, f.Errorf(s, "retention", "%s is shorter than how long %s retries a webhook (%s): a retry after the retention is applied again; keep it at least %s",
				formatDuration(retention), s.Verify.Scheme, formatDuration(horizon), formatDuration(horizon)))
		}
	}
	for _, s := range f.Sources {
		out = append(out, f.targetWarnings(s, s.Publish)...)
	}
	for _, s := range f.Subscriptions {
		out = append(out, f.targetWarnings(s, s.Publish)...)
	}
	return out
}

// targetWarnings are the warnings of pipeline p's targets ts.
func (f *File) targetWarnings(p any, ts pipeline.Targets) []error {
	var out []error
	for i := range ts {
		t := &ts[i]
		if t.SQS == nil || t.Key == nil || outbox.SQSFIFO(t.SQS.Queue) {
			continue
		}
		out = append(out, f.Errorf(p, targetField(f.locs[p], len(ts), i)+".sqs.queue", "%s is a standard queue, which keeps no order: events of one key may arrive out of order; use a FIFO queue (a name ending in .fifo), whose MessageGroupId is the key", t.SQS.Queue))
	}
	return out
}

// formatDuration writes d as a pipelines file would, with days when it has whole ones and
// without zero trailing units: 3d, 1d3h35m, 4h, 90s.
func formatDuration(d time.Duration) string {
	days := d / (24 * time.Hour)
	rest := d - days*24*time.Hour
	var s string
	if rest != 0 || days == 0 {
		s = rest.String()
		if strings.HasSuffix(s, "m0s") {
			s = s[:len(s)-2]
		}
		if strings.HasSuffix(s, "h0m") {
			s = s[:len(s)-2]
		}
	}
	if days == 0 {
		return s
	}
	return fmt.Sprintf("%dd%s", days, s)
}

// retention is the dedup retention of pipeline p, a *receiver.Source or a
// *consumer.Config, with the defaults filled.
func retention(p any) time.Duration {
	switch p := p.(type) {
	case *receiver.Source:
		if p.Idempotency != nil {
			return cmp.Or(p.Idempotency.Retention, pipeline.IdempotencyRetentionDefault)
		}
		return cmp.Or(p.Retention, pipeline.RetentionDefault)
	case *consumer.Config:
		return cmp.Or(p.Retention, pipeline.RetentionDefault)
	}
	return 0
}

// LongestRetention is the longest dedup retention of f's pipelines (0 without any).
func (f *File) LongestRetention() time.Duration {
	var longest time.Duration
	for _, s := range f.Sources {
		longest = max(longest, retention(s))
	}
	for _, s := range f.Subscriptions {
		longest = max(longest, retention(s))
	}
	return longest
}

// EpochsWarnings are the warnings of pruning by epochs opened every interval
// (IDEMD_PROCESSED_PARTITION_INTERVAL; none when it is 0). A record stays up to one
// interval past its retention: a warning when the interval is longer than the longest
// retention. And a new id is looked for in every older epoch: a warning when the longest
// retention holds more than eight intervals.
func (f *File) EpochsWarnings(interval time.Duration) []error {
	longest := f.LongestRetention()
	if interval <= 0 || longest == 0 {
		return nil
	}
	var out []error
	if interval > longest {
		out = append(out, fmt.Errorf("IDEMD_PROCESSED_PARTITION_INTERVAL: %s is longer than the longest retention (%s), and a record stays until its epoch is dropped, up to one interval past its retention; the longest retention (%s, the default, auto) keeps records at most one retention past it",
			interval, formatDuration(longest), formatDuration(longest)))
	}
	if n := longest / interval; n > 8 {
		out = append(out, fmt.Errorf("IDEMD_PROCESSED_PARTITION_INTERVAL: %s keeps about %d epochs of processed_messages for the longest retention (%s), and a new id is looked for in each older one; the longest retention (%s, the default, auto) keeps two or three",
			interval, n+1, formatDuration(longest), formatDuration(longest)))
	}
	return out
}

// PoolWarnings warn when the subscriptions apply more batches at once (batches_in_flight,
// each holding a connection while it runs) than a pool of maxConns (IDEMD_DB_MAX_CONNS)
// has connections: batches then wait for one, and the receiver's, the relay's and the
// pruner's transactions wait with them.
func (f *File) PoolWarnings(maxConns int32) []error {
	n := 0
	for _, s := range f.Subscriptions {
		n += cmp.Or(s.BatchesInFlight, consumer.BatchesInFlightDefault)
	}
	if n <= int(maxConns) {
		return nil
	}
	return []error{fmt.Errorf("IDEMD_DB_MAX_CONNS: %d connections, and the subscriptions apply up to %d batches at once (batches_in_flight, %d each by default), each holding one while it runs: batches wait for a connection, and the receiver's and the relay's transactions with them; raise IDEMD_DB_MAX_CONNS to more than %d, or lower batches_in_flight",
		maxConns, n, consumer.BatchesInFlightDefault, n)}
}

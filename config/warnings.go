package config

import (
	"cmp"
	"fmt"
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

// formatDuration writes d with days when it has whole ones: 3d, 1d3h35m0s, 4h0m0s.
func formatDuration(d time.Duration) string {
	days := d / (24 * time.Hour)
	if days == 0 {
		return d.String()
	}
	if rest := d - days*24*time.Hour; rest != 0 {
		return fmt.Sprintf("%dd%s", days, rest)
	}
	return fmt.Sprintf("%dd", days)
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

// EpochsWarnings are the warnings of pruning by epochs opened every interval
// (IDEMD_PROCESSED_PARTITION_INTERVAL; none when it is 0). An epoch is dropped only once
// its longest-kept record has expired, so a pipeline's records stay up to the longest
// retention of any pipeline plus the interval: a warning for each pipeline whose records
// would stay more than twice its own retention. And a new id is looked for in every older
// epoch: a warning when the longest retention holds more than eight intervals.
func (f *File) EpochsWarnings(interval time.Duration) []error {
	if interval <= 0 {
		return nil
	}
	var pipelines []any
	for _, s := range f.Sources {
		pipelines = append(pipelines, s)
	}
	for _, s := range f.Subscriptions {
		pipelines = append(pipelines, s)
	}
	var longest time.Duration
	for _, p := range pipelines {
		longest = max(longest, retention(p))
	}
	kept := longest + interval
	var out []error
	for _, p := range pipelines {
		field := "retention"
		if s, ok := p.(*receiver.Source); ok && s.Idempotency != nil {
			field = "idempotency.retention"
		}
		if r := retention(p); kept > 2*r {
			out = append(out, f.Errorf(p, field, "%s, but with IDEMD_PROCESSED_PARTITION_INTERVAL=%s its records stay until their epoch is dropped, up to %s (the longest retention, %s, plus the interval): use like retentions, or prune by rows (IDEMD_PROCESSED_PARTITION_INTERVAL=0)",
				formatDuration(r), interval, formatDuration(kept), formatDuration(longest)))
		}
	}
	if n := longest / interval; n > 8 {
		out = append(out, fmt.Errorf("IDEMD_PROCESSED_PARTITION_INTERVAL: %s keeps about %d epochs of processed_messages for the longest retention (%s), and a new id is looked for in each older one; about the longest retention / 4 (%s) keeps five or six",
			interval, n+1, formatDuration(longest), formatDuration(longest/4)))
	}
	return out
}

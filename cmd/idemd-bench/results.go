package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"
)

// Row is one measured figure.
type Row struct {
	Section    string  `json:"section"`
	Mode       string  `json:"mode"`
	Count      int     `json:"count"`
	Seconds    float64 `json:"seconds"`
	Rate       float64 `json:"rate"`
	Unit       string  `json:"unit"`
	P50ms      float64 `json:"p50_ms,omitempty"`
	P99ms      float64 `json:"p99_ms,omitempty"`
	P999ms     float64 `json:"p999_ms,omitempty"`
	PeakRSSMiB float64 `json:"peak_rss_mib,omitempty"`
	Note       string  `json:"note,omitempty"`
}

// Ratio is a figure beside its baseline from the same run, with the goal it is held to.
type Ratio struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	Goal  string  `json:"goal"`
	Met   bool    `json:"met"`
}

// Results is everything one run measured.
type Results struct {
	Machine      Machine        `json:"machine"`
	Options      map[string]any `json:"options"`
	Limit        *Row           `json:"limit,omitempty"`
	LimitOne     *Row           `json:"limit_one_tx,omitempty"`
	Consumer     *Row           `json:"consumer,omitempty"`
	ConsumerOne  *Row           `json:"consumer_one_tx,omitempty"`
	Receiver     *Row           `json:"receiver,omitempty"`
	ReceiverOne  *Row           `json:"receiver_one_tx,omitempty"`
	Relay        *Row           `json:"relay,omitempty"`
	RelayLatency *Row           `json:"relay_latency,omitempty"`
	Ratios       []Ratio        `json:"ratios"`
}

func (o *options) public() map[string]any {
	return map[string]any{
		"messages": o.messages, "messages_one": o.messagesOne, "partitions": o.partitions, "batch": o.batch,
		"limit_batch": o.limitBatch, "duration": o.duration.String(), "duration_one": o.durationOne.String(),
		"concurrency": o.concurrency, "max_batch": o.maxBatch, "receiver_conns": o.receiverConns,
		"relay_events": o.relayEvents, "relay_batch": o.relayBatch, "relay_rate": o.relayRate,
		"relay_duration": o.relayDuration.String(), "only": o.only,
	}
}

// ratios computes the figures the goals are about, where both sides were measured.
func (r *Results) ratios() []Ratio {
	var out []Ratio
	add := func(name string, v float64, goal string, met bool) {
		out = append(out, Ratio{Name: name, Value: v, Goal: goal, Met: met})
	}
	if r.Consumer != nil && r.Limit != nil {
		v := r.Consumer.Rate / r.Limit.Rate
		add("consumer / limit (batched)", v, ">= 0.70", v >= 0.7)
	}
	if r.Consumer != nil && r.ConsumerOne != nil {
		v := r.Consumer.Rate / r.ConsumerOne.Rate
		add("consumer / consumer one tx per message", v, ">= 5", v >= 5)
	}
	if r.ConsumerOne != nil && r.LimitOne != nil {
		v := r.ConsumerOne.Rate / r.LimitOne.Rate
		add("consumer one tx / limit one tx", v, "(info)", true)
	}
	if r.Limit != nil && r.LimitOne != nil {
		v := r.Limit.Rate / r.LimitOne.Rate
		add("limit batched / limit one tx", v, "(info)", true)
	}
	if r.Receiver != nil {
		add("receiver webhooks/s", r.Receiver.Rate, ">= 5000", r.Receiver.Rate >= 5000)
		add("receiver p99 ms", r.Receiver.P99ms, "<= 50", r.Receiver.P99ms <= 50)
	}
	if r.Receiver != nil && r.ReceiverOne != nil {
		v := r.Receiver.Rate / r.ReceiverOne.Rate
		add("receiver / receiver one tx per request", v, ">= 2", v >= 2)
	}
	if r.Receiver != nil && r.Limit != nil {
		add("receiver / limit (batched)", r.Receiver.Rate/r.Limit.Rate, "(info)", true)
	}
	if r.Relay != nil {
		add("relay events/s", r.Relay.Rate, ">= 30000", r.Relay.Rate >= 30000)
	}
	if r.RelayLatency != nil {
		add("relay p99 ms at steady rate", r.RelayLatency.P99ms, "<= 50", r.RelayLatency.P99ms <= 50)
	}
	var peak float64
	for _, row := range []*Row{r.Consumer, r.ConsumerOne, r.Receiver, r.ReceiverOne, r.Relay} {
		if row != nil {
			peak = max(peak, row.PeakRSSMiB)
		}
	}
	if peak > 0 {
		add("peak RSS of idemd, MiB (max over loads)", peak, "<= 150 MB", peak*1.048576 <= 150)
	}
	return out
}

func (r *Results) print(w io.Writer) {
	r.Ratios = r.ratios()
	m := r.Machine
	fmt.Fprintf(w, "idemd-bench  %s  %d CPUs (GOMAXPROCS %d), %d MiB RAM, %s\n", m.Started, m.CPUs, m.GOMAXPROCS, m.MemoryMB, m.GoVersion)
	fmt.Fprintf(w, "PostgreSQL %s (fsync=%s, synchronous_commit=%s); Kafka: %s\n\n", m.PostgreSQL, m.Fsync, m.SynchronousCommit, m.Broker)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "section\tmode\tcount\tseconds\trate\tunit\tp50 ms\tp99 ms\tp999 ms\tpeak RSS MiB\t")
	for _, row := range []*Row{r.Limit, r.LimitOne, r.Consumer, r.ConsumerOne, r.Receiver, r.ReceiverOne, r.Relay, r.RelayLatency} {
		if row == nil {
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.2f\t%.0f\t%s\t%s\t%s\t%s\t%s\t\n", row.Section, row.Mode, row.Count, row.Seconds, row.Rate, row.Unit,
			opt(row.P50ms), opt(row.P99ms), opt(row.P999ms), opt(row.PeakRSSMiB))
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tvalue\tgoal\tmet")
	for _, ra := range r.Ratios {
		met := "yes"
		if !ra.Met {
			met = "NO"
		}
		if ra.Goal == "(info)" {
			met = ""
		}
		fmt.Fprintf(tw, "%s\t%.2f\t%s\t%s\n", ra.Name, ra.Value, ra.Goal, met)
	}
	_ = tw.Flush()
	var notes []string
	for _, row := range []*Row{r.Consumer, r.Receiver, r.Relay, r.RelayLatency} {
		if row != nil && row.Note != "" {
			notes = append(notes, fmt.Sprintf("  %s (%s): %s", row.Section, row.Mode, row.Note))
		}
	}
	if len(notes) > 0 {
		fmt.Fprintln(w, "\nnotes:\n"+strings.Join(notes, "\n"))
	}
}

func opt(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", v)
}

func quote(schema string) string { return pgx.Identifier{schema}.Sanitize() }

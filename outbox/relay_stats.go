package outbox

import "github.com/segmentio/kafka-go"

// Stats returns the statistics of the relay's Kafka writer since the previous call
// (kafka-go zeroes its counters at each call, so give the relay to one collector only:
// metrics.WatchKafkaWriter). A Writer that is not kafka-go's (RelayConfig.Writer) has none;
// the relay's own Writers add up their counters (tieredWriter).
func (r *Relay) Stats() kafka.WriterStats {
	if w, ok := r.writer.(interface{ Stats() kafka.WriterStats }); ok {
		return w.Stats()
	}
	return kafka.WriterStats{}
}

package receiver

import (
	"sync"
	"time"

	"github.com/sirupsen/logrus"
)

// failureLogEvery is how often a source logs a transient failure (its transactions failing:
// the database down, say) while they go on.
const failureLogEvery = time.Second

// failureLog keeps a source's transient-failure errors to one line a second during an
// outage, the line saying how many it stands for: a database down under 1,000 webhooks/s
// wrote 1,000 identical error lines a second. Each request still gets its 503, and counts in
// idemd_http_request_duration_seconds{code="503"}.
type failureLog struct {
	mu         sync.Mutex
	next       time.Time
	suppressed int
}

// error logs err and msg on log at error level, unless such a line was written less than
// failureLogEvery ago: then it only counts it, for the next line's count.
func (f *failureLog) error(log *logrus.Entry, err error, msg string) {
	now := time.Now()
	f.mu.Lock()
	if now.Before(f.next) {
		f.suppressed++
		f.mu.Unlock()
		return
	}
	n := f.suppressed
	f.suppressed, f.next = 0, now.Add(failureLogEvery)
	f.mu.Unlock()
	if n > 0 {
		log = log.WithField("count", n)
	}
	log.WithError(err).Error(msg)
}

package metrics

import (
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// poolStats exports the statistics of the connection pools given to WatchPool, summed: a
// process has one pool (the daemon's); tests may have several.
var poolStats = &poolCollector{pools: map[*pgxpool.Pool]int{}}

// WatchPool exports pool's statistics (pgxpool.Stat) at every scrape until stop is called.
//
// pgxpool does not count the goroutines waiting for a connection at a given instant; it
// adds up the time they waited. The rate of idemd_db_pool_acquire_wait_seconds_total is
// therefore the mean number of waiters over the rate window (Little's law), which is what
// an operator asks "are requests queueing for connections?".
func WatchPool(pool *pgxpool.Pool) (stop func()) {
	poolStats.mu.Lock()
	poolStats.pools[pool]++
	poolStats.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			poolStats.mu.Lock()
			defer poolStats.mu.Unlock()
			if poolStats.pools[pool]--; poolStats.pools[pool] <= 0 {
				delete(poolStats.pools, pool)
			}
		})
	}
}

var (
	poolConnsDesc = prometheus.NewDesc("idemd_db_pool_connections",
		"Connections of the PostgreSQL pool, by state: acquired (in use), idle, constructing.", []string{"state"}, nil)
	poolMaxDesc = prometheus.NewDesc("idemd_db_pool_max_connections",
		"Size of the PostgreSQL pool (IDEMD_DB_MAX_CONNS).", nil, nil)
	poolAcquiresDesc = prometheus.NewDesc("idemd_db_pool_acquires_total",
		"Successful connection acquires from the PostgreSQL pool.", nil, nil)
	poolAcquireSecondsDesc = prometheus.NewDesc("idemd_db_pool_acquire_seconds_total",
		"Total time spent acquiring connections (divide its rate by the acquires' rate for the mean acquire time).", nil, nil)
	poolWaitedDesc = prometheus.NewDesc("idemd_db_pool_waited_acquires_total",
		"Acquires that had to wait because every connection was in use.", nil, nil)
	poolWaitSecondsDesc = prometheus.NewDesc("idemd_db_pool_acquire_wait_seconds_total",
		"Total time acquires waited for a free connection; its rate is the mean number of waiting acquires.", nil, nil)
	poolCanceledDesc = prometheus.NewDesc("idemd_db_pool_canceled_acquires_total",
		"Acquires canceled (context ended) while waiting for a connection.", nil, nil)
)

type poolCollector struct {
	mu    sync.Mutex
	pools map[*pgxpool.Pool]int
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{poolConnsDesc, poolMaxDesc, poolAcquiresDesc, poolAcquireSecondsDesc, poolWaitedDesc, poolWaitSecondsDesc, poolCanceledDesc} {
		ch <- d
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.pools) == 0 {
		return // no pool, no series: a one-shot command exports nothing misleading
	}
	var acquired, idle, constructing, maxConns, acquires, waited, canceled float64
	var acquireSecs, waitSecs float64
	for p := range c.pools {
		s := p.Stat()
		acquired += float64(s.AcquiredConns())
		idle += float64(s.IdleConns())
		constructing += float64(s.ConstructingConns())
		maxConns += float64(s.MaxConns())
		acquires += float64(s.AcquireCount())
		acquireSecs += s.AcquireDuration().Seconds()
		waited += float64(s.EmptyAcquireCount())
		waitSecs += s.EmptyAcquireWaitTime().Seconds()
		canceled += float64(s.CanceledAcquireCount())
	}
	ch <- prometheus.MustNewConstMetric(poolConnsDesc, prometheus.GaugeValue, acquired, "acquired")
	ch <- prometheus.MustNewConstMetric(poolConnsDesc, prometheus.GaugeValue, idle, "idle")
	ch <- prometheus.MustNewConstMetric(poolConnsDesc, prometheus.GaugeValue, constructing, "constructing")
	ch <- prometheus.MustNewConstMetric(poolMaxDesc, prometheus.GaugeValue, maxConns)
	ch <- prometheus.MustNewConstMetric(poolAcquiresDesc, prometheus.CounterValue, acquires)
	ch <- prometheus.MustNewConstMetric(poolAcquireSecondsDesc, prometheus.CounterValue, acquireSecs)
	ch <- prometheus.MustNewConstMetric(poolWaitedDesc, prometheus.CounterValue, waited)
	ch <- prometheus.MustNewConstMetric(poolWaitSecondsDesc, prometheus.CounterValue, waitSecs)
	ch <- prometheus.MustNewConstMetric(poolCanceledDesc, prometheus.CounterValue, canceled)
}

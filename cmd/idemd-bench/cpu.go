package main

import (
	"context"
	"strconv"
	"syscall"
	"time"

	"github.com/idemd/idemd/internal/proccpu"
)

// CPU per message, by process: on a shared machine the rates move with the other work on
// the cores, the CPU each side spends per message much less. The bench reads it from
// /proc: the idemd child, the PostgreSQL backends serving the child's connections (found by
// their application_name), and the bench process itself (the load generator, and the
// in-process broker when there is one). PostgreSQL's shared background work (WAL writer,
// checkpointer) is not counted. With -relay-pool the backends of the relay's own pool are
// counted in PostgresUs and shown apart.

// CPU is the CPU time each side spent per message (microseconds). For the limit, which
// runs in the bench process, IdemdUs is its pgx client and there is no generator.
type CPU struct {
	IdemdUs     float64 `json:"idemd_us_per_msg"`
	PostgresUs  float64 `json:"postgres_us_per_msg"`
	GeneratorUs float64 `json:"generator_us_per_msg,omitempty"`
	// RelayPostgresUs is the part of PostgresUs spent by the backends of the relay's pool
	// of its own (-relay-pool).
	RelayPostgresUs float64 `json:"relay_postgres_us_per_msg,omitempty"`
}

// cpuStart is the CPU use of a child's three sides when its load began.
type cpuStart struct {
	app      string
	child    time.Duration
	self     time.Duration
	backends map[int]time.Duration
	// relay are the backends of the relay's pool of its own (-relay-pool), by pid.
	relay     map[int]time.Duration
	readError bool
	// work are PostgreSQL's counters (pgwork.go); workEnd those once the child stopped.
	work, workEnd *pgCounters
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// backendCPU is the CPU time of each PostgreSQL backend whose application_name is app.
func (e *env) backendCPU(ctx context.Context, app string) (map[int]time.Duration, bool) {
	rows, err := e.pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, app)
	if err != nil {
		return nil, false
	}
	defer rows.Close()
	out := map[int]time.Duration{}
	ok := true
	for rows.Next() {
		var pid int
		if rows.Scan(&pid) != nil {
			return nil, false
		}
		d, read := proccpu.Of(pid)
		ok = ok && read
		out[pid] = d
	}
	return out, ok && rows.Err() == nil
}

// startCPU records the CPU use of c's sides now.
func (e *env) startCPU(ctx context.Context, c *child, app string) {
	s := &cpuStart{app: app, self: selfCPU()}
	var ok bool
	s.child, ok = proccpu.Of(c.cmd.Process.Pid)
	s.backends, s.readError = e.backendCPU(ctx, app)
	s.readError = !ok || !s.readError
	if e.o.relayPool {
		var read bool
		s.relay, read = e.backendCPU(ctx, app+relayAppSuffix)
		s.readError = s.readError || !read
	}
	s.work = e.pgCountersNow(ctx)
	c.cpu = s
}

// cpuPerMessage is the CPU c's sides spent since startCPU, per message, or nil when
// /proc could not be read.
func (e *env) cpuPerMessage(ctx context.Context, c *child, messages int) *CPU {
	s := c.cpu
	if s == nil || s.readError || messages <= 0 {
		return nil
	}
	child, ok := proccpu.Of(c.cmd.Process.Pid)
	backends, ok2 := e.backendCPU(ctx, s.app)
	if !ok || !ok2 {
		return nil
	}
	since := func(now, start map[int]time.Duration) time.Duration {
		var d time.Duration
		for pid, t := range now {
			d += t - start[pid] // a backend that connected meanwhile started from 0
		}
		return d
	}
	pg := since(backends, s.backends)
	var relay time.Duration
	if s.relay != nil {
		now, ok := e.backendCPU(ctx, s.app+relayAppSuffix)
		if !ok {
			return nil
		}
		relay = since(now, s.relay)
	}
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(messages) }
	return &CPU{IdemdUs: per(child - s.child), PostgresUs: per(pg + relay), GeneratorUs: per(selfCPU() - s.self), RelayPostgresUs: per(relay)}
}

func (c *CPU) String() string {
	if c == nil {
		return "-"
	}
	gen := "-"
	if c.GeneratorUs > 0 {
		gen = strconv.FormatFloat(c.GeneratorUs, 'f', 0, 64)
	}
	pg := strconv.FormatFloat(c.PostgresUs, 'f', 0, 64)
	if c.RelayPostgresUs > 0 {
		pg += " (relay " + strconv.FormatFloat(c.RelayPostgresUs, 'f', 1, 64) + ")"
	}
	return strconv.FormatFloat(c.IdemdUs, 'f', 0, 64) + " / " + pg + " / " + gen
}

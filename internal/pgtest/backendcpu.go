package pgtest

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/internal/proccpu"
)

// BackendCPU measures the CPU time of the PostgreSQL backend serving conn, for benchmarks
// to report what a statement costs the server beside their wall time. It works when the
// server runs on this machine; otherwise (or without /proc) it reports nothing.
type BackendCPU struct {
	pid   int
	start time.Duration
	ok    bool
}

// StartBackendCPU starts measuring conn's backend.
func StartBackendCPU(conn *pgx.Conn) *BackendCPU {
	pid := int(conn.PgConn().PID())
	// A PID of this machine's /proc is conn's backend only if the server is here.
	comm, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil || strings.TrimSpace(string(comm)) != "postgres" {
		return &BackendCPU{}
	}
	start, ok := proccpu.Of(pid)
	return &BackendCPU{pid: pid, start: start, ok: ok}
}

// Report reports the backend's CPU since the start per op as the metric "pg-µs/"+unit,
// when it could be read. The time comes in ticks of 10 ms: give it a second or more.
func (c *BackendCPU) Report(b *testing.B, ops int, unit string) {
	if !c.ok || ops == 0 {
		return
	}
	now, ok := proccpu.Of(c.pid)
	if !ok {
		return
	}
	b.ReportMetric(float64((now-c.start).Microseconds())/float64(ops), "pg-µs/"+unit)
}

// Package proctest runs the idemd binary as a subprocess of a test, the way an operator
// runs it. It guarantees that:
//
//   - cmd/idemd is built at most once per test binary, into a temporary directory that Main
//     removes when the tests are done;
//   - a process sees only PATH, HOME and the variables the test gives it: none of the test's
//     own IDEMD_ environment leaks in;
//   - its stdout and stderr are captured and may be read while it runs;
//   - a process still running when its test ends is killed (SIGKILL) at cleanup.
package proctest

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// idemdPkg is the import path of the command Binary builds.
const idemdPkg = "github.com/idemd/idemd/cmd/idemd"

var (
	buildOnce sync.Once
	binDir    string
	binary    string
	buildErr  error
)

// Main runs the tests of m and then removes the binary Binary built. Call it from
// TestMain: func TestMain(m *testing.M) { proctest.Main(m) }.
func Main(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// Binary returns the path of the idemd binary, building it on first use.
func Binary(tb testing.TB) string {
	tb.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "idemd-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binDir, binary = dir, filepath.Join(dir, "idemd")
		out, err := exec.Command("go", "build", "-o", binary, idemdPkg).CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		tb.Fatalf("proctest: %v", buildErr)
	}
	return binary
}

// Proc is one running (or exited) idemd process.
type Proc struct {
	cmd            *exec.Cmd
	stdout, stderr buffer
	done           chan struct{}
	err            error
}

// Start runs idemd with args; its environment is PATH, HOME and env. It returns at once.
// The process is killed at cleanup if it is still running.
func Start(tb testing.TB, env map[string]string, args ...string) *Proc {
	tb.Helper()
	cmd := exec.Command(Binary(tb), args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	p := &Proc{cmd: cmd, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &p.stdout, &p.stderr
	if err := cmd.Start(); err != nil {
		tb.Fatalf("proctest: starting idemd: %v", err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	tb.Cleanup(func() {
		if !p.Exited() {
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// Stdout is what the process wrote to stdout so far.
func (p *Proc) Stdout() string { return p.stdout.String() }

// Stderr is what the process wrote to stderr so far.
func (p *Proc) Stderr() string { return p.stderr.String() }

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err is the error of the process's Wait once it has exited (nil for exit code 0), and nil
// while it runs.
func (p *Proc) Err() error {
	if !p.Exited() {
		return nil
	}
	return p.err
}

// ExitCode waits for the process to exit and returns its exit code (-1 if a signal ended
// it).
func (p *Proc) ExitCode() int {
	<-p.done
	return p.cmd.ProcessState.ExitCode()
}

// Signal sends sig to the process.
func (p *Proc) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Wait waits up to timeout for the process to exit and reports whether it did.
func (p *Proc) Wait(timeout time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(timeout):
		return false
	}
}

// Stop sends SIGTERM (if the process is still there) and waits up to timeout for it to
// exit; it returns the exit code, or fails the test.
func (p *Proc) Stop(tb testing.TB, timeout time.Duration) int {
	tb.Helper()
	_ = p.Signal(syscall.SIGTERM)
	if !p.Wait(timeout) {
		tb.Fatalf("idemd did not exit after SIGTERM")
	}
	return p.ExitCode()
}

// Kill sends SIGKILL (no drain, no offset commit, no relay flush) and waits for the exit.
func (p *Proc) Kill(tb testing.TB) {
	tb.Helper()
	_ = p.Signal(syscall.SIGKILL)
	if !p.Wait(10 * time.Second) {
		tb.Fatalf("idemd did not die of SIGKILL")
	}
}

// ReadyLine is what the daemon logs (at info) once every role runs.
const ReadyLine = "idemd is serving"

// WaitReady waits for the daemon's ReadyLine in stderr (the process's signal that it
// serves; it needs IDEMD_LOG_LEVEL info or lower), then asks http://adminAddr/readyz,
// which must answer 200; an orchestrator's probe would ask again, so a failed answer is
// asked again after a short growing pause. It returns an error if the process exits first
// or timeout passes.
func (p *Proc) WaitReady(adminAddr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	if err := p.WaitLog(ReadyLine, 1, timeout); err != nil {
		return fmt.Errorf("did not become ready: %w", err)
	}
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		resp, err := http.Get("http://" + adminAddr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		switch {
		case p.Exited():
			return fmt.Errorf("exited before it was ready (%v)", p.Err())
		case time.Now().Add(wait).After(deadline):
			return fmt.Errorf("logged %q but /readyz does not answer 200 (%v)", ReadyLine, err)
		}
		time.Sleep(wait)
	}
}

// WaitLog waits until stderr holds sub at least n times. It wakes on each write of the
// process, not on a timer; it returns an error if the process exits first or timeout
// passes.
func (p *Proc) WaitLog(sub string, n int, timeout time.Duration) error {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		text, changed := p.stderr.snapshot()
		if strings.Count(text, sub) >= n {
			return nil
		}
		select {
		case <-changed:
		case <-p.done:
			if text, _ := p.stderr.snapshot(); strings.Count(text, sub) >= n {
				return nil
			}
			return fmt.Errorf("exited before logging %q %d times (%v)", sub, n, p.err)
		case <-timer.C:
			return fmt.Errorf("did not log %q %d times within %s", sub, n, timeout)
		}
	}
}

// FreeAddr returns a loopback address with a port free right now, for a process the test
// starts (and may restart on the same address). The port is taken below the kernel's range
// of ephemeral ports: a port from that range, once free, may become the local end of any
// outbound connection (the tests open many, to PostgreSQL and the brokers) before the
// process it was meant for binds it, which then fails with "address already in use". No
// port is given twice by one test binary.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	if lo, hi := freePortsFrom, ephemeralLow(); hi-lo >= 1000 {
		for range 100 {
			port := lo + rand.IntN(hi-lo)
			if portsGiven[port] {
				continue
			}
			addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				continue
			}
			_ = ln.Close()
			portsGiven[port] = true
			return addr
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("proctest: %v", err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// freePortsFrom is the lowest port FreeAddr gives: above the well-known services' ports.
const freePortsFrom = 20000

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

// ephemeralLow is the first port of the kernel's ephemeral range (Linux's default 32768
// where it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 32768
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return lo
}

// buffer is a bytes.Buffer safe for a writer and readers at once, which tells readers that
// it grew.
type buffer struct {
	mu      sync.Mutex
	b       bytes.Buffer
	changed chan struct{} // closed (and replaced) by each write
}

func (s *buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
	return s.b.Write(p)
}

// snapshot returns the content and a channel closed by the next write.
func (s *buffer) snapshot() (string, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.changed == nil {
		s.changed = make(chan struct{})
	}
	return s.b.String(), s.changed
}

func (s *buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

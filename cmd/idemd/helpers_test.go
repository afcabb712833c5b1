package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
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

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
)

var (
	buildOnce sync.Once
	binary    string
	buildErr  error
)

// idemdBinary builds the command once per test binary, into a temporary directory.
func idemdBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "idemd-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binary = filepath.Join(dir, "idemd")
		out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	require.NoError(t, buildErr)
	return binary
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// proc is a running idemd.
type proc struct {
	cmd            *exec.Cmd
	stdout, stderr *syncBuffer
	done           chan struct{}
	err            error
}

// baseEnv is the environment of every subprocess: none of the test's own IDEMD_ variables.
func baseEnv(vars map[string]string) []string {
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for k, v := range vars {
		env = append(env, k+"="+v)
	}
	return env
}

// startIdemd runs idemd with args and vars; it is killed at cleanup if still running.
func startIdemd(t *testing.T, vars map[string]string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(idemdBinary(t), args...)
	cmd.Env = baseEnv(vars)
	p := &proc{cmd: cmd, stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.stdout, p.stderr
	require.NoError(t, cmd.Start())
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("idemd stdout:\n%s\nidemd stderr:\n%s", p.stdout, p.stderr)
		}
	})
	return p
}

// runIdemd runs idemd to completion and returns its exit code, stdout and stderr.
func runIdemd(t *testing.T, vars map[string]string, args ...string) (int, string, string) {
	t.Helper()
	p := startIdemd(t, vars, args...)
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("idemd %v did not exit", args)
	}
	return p.cmd.ProcessState.ExitCode(), p.stdout.String(), p.stderr.String()
}

// stop sends SIGTERM and waits for the exit; it returns the exit code and how long it took.
func (p *proc) stop(t *testing.T, within time.Duration) (int, time.Duration) {
	t.Helper()
	start := time.Now()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-p.done:
	case <-time.After(within + 10*time.Second):
		t.Fatalf("idemd did not exit within %s of SIGTERM", within)
	}
	return p.cmd.ProcessState.ExitCode(), time.Since(start)
}

// waitReady polls /readyz (an external process gives no other signal) until 200.
func (p *proc) waitReady(t *testing.T, adminAddr string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			t.Fatalf("idemd exited before it was ready (%v)", p.err)
		default:
		}
		resp, err := http.Get("http://" + adminAddr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("idemd did not become ready")
}

// freeAddr returns a loopback address with a port free right now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

// testSchema returns a fresh schema name for IDEMD_DB_SCHEMA, and drops it (and its _dev
// sibling) at cleanup.
func testSchema(t *testing.T) string {
	t.Helper()
	schema := pgtest.SchemaName(t)
	pool := pgtest.Pool(t, 2)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, s := range []string{schema, schema + "_dev"} {
			_, _ = pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{s}.Sanitize()+" CASCADE")
		}
	})
	return schema
}

// stripeRequest is a webhook signed the way Stripe signs it.
func stripeRequest(t *testing.T, url, secret string, body []byte) *http.Request {
	t.Helper()
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(ts + "." + string(body)))
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Stripe-Signature", "t="+ts+",v1="+hex.EncodeToString(mac.Sum(nil)))
	return req
}

// lines of s that contain sub.
func linesWith(s, sub string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return out
}

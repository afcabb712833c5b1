package receiver

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/internal/doortest"
)

// TestConformance runs the doors' conformance suite through HTTP: Stripe-signed webhooks,
// sent the way Stripe sends them (retried until answered).
func TestConformance(t *testing.T) {
	t.Parallel()
	doortest.Run(t, newHTTPDoor)
}

type httpDoor struct {
	env     *doortest.Env
	rcv     *Receiver
	srv     *httptest.Server
	armed   atomic.Bool
	crashed atomic.Bool
}

func newHTTPDoor(t *testing.T, env *doortest.Env) doortest.Door {
	rcv, err := New(env.DB.Pool, &Config{Schema: env.DB.Schema, Logger: quietLogger(), Sources: []Source{{
		Name: env.Pipeline, Verify: Verify{Scheme: SchemeStripe, Secrets: []string{testSecret}},
		Effect: Effect{SQL: env.EffectSQL}, MaxAttempts: 1,
	}}})
	require.NoError(t, err)
	t.Cleanup(rcv.Close)
	d := &httpDoor{env: env, rcv: rcv}
	d.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if d.armed.CompareAndSwap(true, false) {
			// Committed, then the process dies before the answer leaves it.
			rcv.ServeHTTP(httptest.NewRecorder(), r)
			d.crashed.Store(true)
			panic(http.ErrAbortHandler)
		}
		rcv.ServeHTTP(w, r)
	}))
	t.Cleanup(d.srv.Close)
	return d
}

// Send posts like a webhook sender: until it gets an answer other than a transient one.
func (d *httpDoor) Send(t *testing.T, id string, body []byte) {
	for attempt := 0; ; attempt++ {
		req, err := http.NewRequest(http.MethodPost, d.srv.URL+"/webhooks/"+d.env.Pipeline, bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Stripe-Signature", stripeSig(testSecret, time.Now(), body))
		res, err := http.DefaultClient.Do(req)
		if err == nil {
			_ = res.Body.Close()
			if res.StatusCode < 500 {
				require.Contains(t, []int{200, 202, 422}, res.StatusCode, "message %s", id)
				return
			}
		}
		require.Less(t, attempt, 20, "message %s: no answer after 20 attempts (%v)", id, err)
	}
}

func (d *httpDoor) Settle(*testing.T) {} // answered means acknowledged

func (d *httpDoor) CrashAfterCommit(*testing.T) { d.armed.Store(true) }

func (d *httpDoor) Restart(t *testing.T) {
	require.True(t, d.crashed.Load(), "the armed crash did not happen")
}

func (d *httpDoor) RegisterReplay(_ *testing.T, rp *deadletter.Replayer) { d.rcv.RegisterReplay(rp) }

func quietLogger() *logrus.Entry {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return logrus.NewEntry(l)
}

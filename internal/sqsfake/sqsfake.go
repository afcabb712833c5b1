// Package sqsfake runs an in-process, in-memory Amazon SQS for `idemd dev` and the tests:
// goaws v0.5.4's SQS handlers (github.com/Admiral-Piett/goaws/app/gosqs), which speak the
// JSON protocol of aws-sdk-go-v2, behind an HTTP server on a local address.
//
// It serves SQS only. goaws's own router also serves SNS, whose package generates an RSA key
// when it is loaded, a cost every idemd command would pay; the SQS routing table is copied
// here instead.
//
// goaws keeps its queues in package-level variables, so there is one SQS per process: Start
// fails while another Server runs. Its handlers read the queue map without its lock; Server
// serialises CreateQueue and DeleteQueue against every other request so that they cannot
// race, and long-polls ReceiveMessage itself so that no request holds that lock for long. What goaws v0.5.4 does differently
// from SQS is listed in docs/brokers.md; the tests of internal/sqstest prove each point.
package sqsfake

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/Admiral-Piett/goaws/app/gosqs"
	"github.com/Admiral-Piett/goaws/app/interfaces"
	"github.com/Admiral-Piett/goaws/app/models"
	"github.com/sirupsen/logrus"
)

// AccountID is the account in the fake's queue URLs and ARNs.
const AccountID = "000000000000"

// Region is the region of the fake's queue ARNs.
const Region = "us-east-1"

// Server is a running fake SQS.
type Server struct {
	ln       net.Listener
	srv      *http.Server
	quit     chan bool
	done     chan struct{}
	stopOnce sync.Once
	// guard: CreateQueue and DeleteQueue write goaws's queue map, which every handler reads
	// without goaws's lock.
	guard sync.RWMutex
}

var running sync.Mutex

// Start serves a fake SQS on addr ("127.0.0.1:0" picks a free port). Only one Server may run
// in a process at a time.
func Start(addr string) (*Server, error) {
	if !running.TryLock() {
		return nil, errors.New("sqsfake: a fake SQS already runs in this process (goaws keeps its queues in globals)")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		running.Unlock()
		return nil, fmt.Errorf("sqsfake: %w", err)
	}
	host, port, _ := net.SplitHostPort(ln.Addr().String())
	// goaws logs through logrus's standard logger, every message body at info: above
	// error, nothing of it is wanted in idemd dev's output or the tests'. (idemd's own
	// loggers are logrus.New() ones.)
	logrus.SetLevel(logrus.ErrorLevel)
	models.SyncQueues.Lock()
	models.SyncQueues.Queues = map[string]*models.Queue{}
	// Region is left empty here: goaws would put it in front of the host of queue URLs
	// (http://us-east-1.127.0.0.1:port/...), which no resolver knows.
	models.CurrentEnvironment = models.Environment{
		Host: host, Port: port, AccountID: AccountID,
		// FIFO queues drop a second message with a MessageDeduplicationId they hold, as SQS
		// does (goaws's default is off).
		EnableDuplicates: true,
		QueueAttributeDefaults: models.EnvQueueAttributes{
			VisibilityTimeout: 30, MaximumMessageSize: 262144, MessageRetentionPeriod: 345600,
		},
	}
	models.SyncQueues.Unlock()

	s := &Server{ln: ln, quit: make(chan bool), done: make(chan struct{})}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(ln)
	}()
	// Visibility timeouts expire and redrive policies apply once a second, as in goaws.
	go gosqs.PeriodicTasks(time.Second, s.quit)
	return s, nil
}

// URL is the endpoint to give the SQS client (BaseEndpoint, AWS_ENDPOINT_URL_SQS).
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() }

// QueueURL is the URL the fake gives the queue name.
func (s *Server) QueueURL(name string) string { return s.URL() + "/" + AccountID + "/" + name }

// Close stops the server and forgets every queue. It is safe to call twice.
func (s *Server) Close() error {
	var err error
	s.stopOnce.Do(func() {
		err = s.srv.Close()
		<-s.done
		close(s.quit)
		models.SyncQueues.Lock()
		models.SyncQueues.Queues = map[string]*models.Queue{}
		models.SyncQueues.Unlock()
		running.Unlock()
	})
	return err
}

// actions are goaws's SQS handlers by action name (goaws app/router, SNS left out).
var actions = map[string]func(*http.Request) (int, interfaces.AbstractResponseBody){
	"CreateQueue":             gosqs.CreateQueueV1,
	"ListQueues":              gosqs.ListQueuesV1,
	"GetQueueAttributes":      gosqs.GetQueueAttributesV1,
	"SetQueueAttributes":      gosqs.SetQueueAttributesV1,
	"SendMessage":             gosqs.SendMessageV1,
	"ReceiveMessage":          gosqs.ReceiveMessageV1,
	"ChangeMessageVisibility": gosqs.ChangeMessageVisibilityV1,
	"DeleteMessage":           gosqs.DeleteMessageV1,
	"GetQueueUrl":             gosqs.GetQueueUrlV1,
	"PurgeQueue":              gosqs.PurgeQueueV1,
	"DeleteQueue":             gosqs.DeleteQueueV1,
	"SendMessageBatch":        gosqs.SendMessageBatchV1,
	"DeleteMessageBatch":      gosqs.DeleteMessageBatchV1,
}

const jsonProtocol = "application/x-amz-json-1.0"

// ServeHTTP answers the SQS JSON protocol (X-Amz-Target: AmazonSQS.Action), the one
// aws-sdk-go-v2 speaks. The older query protocol (Action=… in a form) is answered too, in
// XML, as goaws does.
func (s *Server) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.URL.Path == "/health" {
		w.WriteHeader(http.StatusOK)
		return
	}
	isJSON := req.Header.Get("Content-Type") == jsonProtocol
	var action string
	if isJSON {
		_, action, _ = strings.Cut(req.Header.Get("X-Amz-Target"), ".")
	} else {
		action = req.FormValue("Action")
	}
	handle, ok := actions[action]
	if !ok {
		http.Error(w, fmt.Sprintf("the fake SQS (goaws) does not implement %q", action), http.StatusBadRequest)
		return
	}
	var (
		status int
		body   interfaces.AbstractResponseBody
	)
	if isJSON && action == "ReceiveMessage" {
		status, body = s.receive(req)
	} else {
		status, body = s.call(action, handle, req)
	}
	if !isJSON {
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(status)
		_ = xml.NewEncoder(w).Encode(body)
		return
	}
	w.Header().Set("x-amzn-RequestId", body.GetRequestId())
	w.Header().Set("Content-Type", jsonProtocol)
	w.WriteHeader(status)
	if r := body.GetResult(); r != nil {
		_ = json.NewEncoder(w).Encode(jsonResult(r))
	}
}

// call runs a goaws handler under the guard.
func (s *Server) call(action string, handle func(*http.Request) (int, interfaces.AbstractResponseBody), req *http.Request) (int, interfaces.AbstractResponseBody) {
	if action == "CreateQueue" || action == "DeleteQueue" {
		s.guard.Lock()
		defer s.guard.Unlock()
	} else {
		s.guard.RLock()
		defer s.guard.RUnlock()
	}
	return handle(req)
}

// receive long-polls here rather than in goaws's handler, which would hold the guard (and so
// stall every CreateQueue, and every request behind it) for the whole wait: it asks goaws
// without waiting, every 50 ms, until messages come or WaitTimeSeconds ends.
func (s *Server) receive(req *http.Request) (int, interfaces.AbstractResponseBody) {
	raw, err := io.ReadAll(req.Body)
	var in map[string]any
	if err == nil {
		err = json.Unmarshal(raw, &in)
	}
	if err != nil {
		return s.call("ReceiveMessage", gosqs.ReceiveMessageV1, req)
	}
	wait, _ := in["WaitTimeSeconds"].(float64)
	// An explicit 0 would make goaws wait for the queue's ReceiveMessageWaitTimeSeconds.
	in["WaitTimeSeconds"] = 0
	raw, _ = json.Marshal(in)
	deadline := time.Now().Add(time.Duration(wait * float64(time.Second)))
	for {
		r := req.Clone(req.Context())
		r.Body = io.NopCloser(bytes.NewReader(raw))
		status, body := s.call("ReceiveMessage", gosqs.ReceiveMessageV1, r)
		res, ok := body.GetResult().(models.ReceiveMessageResult)
		if !ok || len(res.Messages) > 0 || !time.Now().Before(deadline) {
			return status, body
		}
		select {
		case <-req.Context().Done():
			return status, body
		case <-time.After(min(50*time.Millisecond, time.Until(deadline))):
		}
	}
}

// jsonResult mends goaws v0.5.4's one JSON answer that the SQS client cannot read: it names
// SendMessageBatch's lists SendMessageBatchResultEntry and BatchResultErrorEntry (their XML
// names) instead of Successful and Failed, so that every entry would look lost.
func jsonResult(r any) any {
	if b, ok := r.(models.SendMessageBatchResult); ok {
		return struct {
			Successful []models.SendMessageBatchResultEntry `json:"Successful"`
			Failed     []models.BatchResultErrorEntry       `json:"Failed"`
		}{b.Entry, b.Error}
	}
	return r
}

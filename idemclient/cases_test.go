package idemclient_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/idemclient"
)

// caseTable is testdata/cases.json: the behaviour idemclient shares with the TypeScript
// client (clients/typescript), whose tests replay the same file.
type caseTable struct {
	Defaults caseConfig `json:"defaults"`
	Config   caseConfig `json:"config"`
	Cases    []struct {
		Name     string     `json:"name"`
		Answers  []answer   `json:"answers"`
		Attempts int        `json:"attempts"`
		WaitsMS  [][2]int64 `json:"waits_ms"`
		Outcome  struct {
			Status   int    `json:"status"`
			Replayed bool   `json:"replayed"`
			Error    string `json:"error"`
		} `json:"outcome"`
	} `json:"cases"`
}

type caseConfig struct {
	MaxAttempts     int   `json:"max_attempts"`
	BackoffMinMS    int64 `json:"backoff_min_ms"`
	BackoffMaxMS    int64 `json:"backoff_max_ms"`
	RetryAfterMaxMS int64 `json:"retry_after_max_ms"`
}

type answer struct {
	Network    bool            `json:"network"`
	Status     int             `json:"status"`
	RetryAfter string          `json:"retry_after"`
	Replayed   bool            `json:"replayed"`
	Problem    json.RawMessage `json:"problem"`
	Body       string          `json:"body"`
}

func (a answer) write(w http.ResponseWriter) {
	if a.Network {
		drop(w)
		return
	}
	if a.RetryAfter != "" {
		w.Header().Set("Retry-After", a.RetryAfter)
	}
	if a.Replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	body := a.Body
	if a.Problem != nil {
		w.Header().Set("Content-Type", "application/problem+json")
		body = string(a.Problem)
	}
	w.WriteHeader(a.Status)
	_, _ = io.WriteString(w, body)
}

func ms(n int64) time.Duration { return time.Duration(n) * time.Millisecond }

// TestSharedCases replays every case of testdata/cases.json against a server that gives
// the case's answers in order, and checks the attempts, the waits and the outcome.
func TestSharedCases(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("testdata/cases.json")
	require.NoError(t, err)
	var table caseTable
	require.NoError(t, json.Unmarshal(raw, &table))
	require.NotEmpty(t, table.Cases)
	require.Equal(t, caseConfig{
		MaxAttempts:     idemclient.MaxAttemptsDefault,
		BackoffMinMS:    idemclient.BackoffMinDefault.Milliseconds(),
		BackoffMaxMS:    idemclient.BackoffMaxDefault.Milliseconds(),
		RetryAfterMaxMS: idemclient.RetryAfterMaxDefault.Milliseconds(),
	}, table.Defaults, "the clients share their defaults")

	for _, tc := range table.Cases {
		t.Run(tc.Name, func(t *testing.T) {
			t.Parallel()
			s := newServer(t, func(w http.ResponseWriter, r *http.Request, n int) {
				if n > len(tc.Answers) {
					http.Error(w, "attempt beyond the case's answers", http.StatusTeapot)
					return
				}
				tc.Answers[n-1].write(w)
			})
			c, retries := newClient(t, idemclient.Config{
				MaxAttempts:   table.Config.MaxAttempts,
				BackoffMin:    ms(table.Config.BackoffMinMS),
				BackoffMax:    ms(table.Config.BackoffMaxMS),
				RetryAfterMax: ms(table.Config.RetryAfterMaxMS),
			})
			resp, err := c.Do(context.Background(), post(t, s.URL, `{"sku":"book"}`))

			switch tc.Outcome.Error {
			case "network":
				require.Error(t, err)
				require.Nil(t, resp)
			case "":
				require.NoError(t, err)
				resp.Body.Close()
				require.Equal(t, tc.Outcome.Status, resp.StatusCode)
				require.Equal(t, tc.Outcome.Replayed, resp.Header.Get("Idempotent-Replayed") == "true")
			default:
				t.Fatalf("unknown outcome error %q", tc.Outcome.Error)
			}

			keys, _, _ := s.seen()
			require.Len(t, keys, tc.Attempts, "attempts")
			for _, k := range keys {
				require.Equal(t, keys[0], k, "one key for every attempt")
			}
			require.Len(t, *retries, len(tc.WaitsMS), "waits")
			for i, r := range *retries {
				require.Equal(t, i+1, r.Attempt)
				require.Equal(t, tc.Answers[i].Status, r.Status, "status of attempt %d", i+1)
				require.GreaterOrEqual(t, r.Wait, ms(tc.WaitsMS[i][0]), "wait after attempt %d", i+1)
				require.LessOrEqual(t, r.Wait, ms(tc.WaitsMS[i][1]), "wait after attempt %d", i+1)
			}
		})
	}
}

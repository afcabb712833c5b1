package main

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/internal/proctest"
)

// TestDevBecomesReady: `idemd dev` with nothing but PostgreSQL — no broker, no pipelines
// file, no secrets — becomes ready, says loudly that its broker is in memory, and prints
// example requests that work when pasted.
func TestDevBecomesReady(t *testing.T) {
	t.Parallel()
	schema := testSchema(t)
	httpAddr, adminAddr := proctest.FreeAddr(t), proctest.FreeAddr(t)
	p := startIdemd(t, map[string]string{
		"IDEMD_DATABASE_URL": pgtest.URL(),
		"IDEMD_DB_SCHEMA":    schema,
		"IDEMD_DB_MAX_CONNS": "6",
		"IDEMD_HTTP_ADDR":    httpAddr,
		"IDEMD_ADMIN_ADDR":   adminAddr,
	}, "dev")
	waitReady(t, p, adminAddr)

	require.Contains(t, p.Stdout(), "DEVELOPMENT ONLY")
	require.Contains(t, p.Stdout(), "IN-MEMORY")
	require.Contains(t, p.Stdout(), "Console:  http://"+adminAddr+"/")
	require.Contains(t, p.Stdout(), "Console token for this run")
	require.Contains(t, p.Stdout(), "Pub/Sub: IN-MEMORY")
	require.Contains(t, p.Stdout(), "SQS: IN-MEMORY")
	// How a shell's clients reach the fakes: every variable they need, with its value.
	require.Regexp(t, `clients: export PUBSUB_EMULATOR_HOST=127\.0\.0\.1:\d+ PUBSUB_PROJECT_ID=\S+\n`, p.Stdout())
	require.Regexp(t, `clients: export AWS_ENDPOINT_URL_SQS=http://\S+ AWS_REGION=\S+ AWS_ACCESS_KEY_ID=dev AWS_SECRET_ACCESS_KEY=dev\n`, p.Stdout())
	// One loud warning per fake: Kafka, Pub/Sub, SQS.
	require.Len(t, linesWith(p.Stderr(), "level=warning msg=\"DEVELOPMENT ONLY"), 3)
	// goaws's own chatter (it logs each poll of an empty queue as a warning) stays out.
	defer func() { require.NotContains(t, p.Stderr(), "No messages in Queue") }()

	curls := linesWith(p.Stdout(), "curl ")
	require.Len(t, curls, 2, p.Stdout())

	// The sign command it prints runs this very binary (a built one here; "go run" under go
	// run) and prints a request.
	signs := linesWith(p.Stdout(), " sign ")
	require.Len(t, signs, 1, p.Stdout())
	sign := strings.Replace(strings.TrimPrefix(signs[0], "#   "), "<name> [-body '<json>']", "stripe", 1)
	require.Contains(t, sign, proctest.Binary(t))
	out, err := exec.Command("bash", "-c", sign).CombinedOutput()
	require.NoError(t, err, "%s\n%s", sign, out)
	require.Contains(t, string(out), "curl ")
	if _, err := exec.LookPath("curl"); err == nil {
		ledger, aws := schema+"_dev.ledger", schema+"_dev.aws_payments"
		w := pgtest.Watch(t, ledger, aws)
		for _, c := range curls {
			c = strings.TrimPrefix(c, "#   ")
			for range 2 {
				out, err := exec.Command("bash", "-c", c).CombinedOutput()
				require.NoError(t, err, string(out))
				status := strings.SplitN(string(out), "\n", 2)[0]
				require.Regexp(t, `^HTTP/1.1 20[01] `, status, string(out))
			}
		}
		// The subscriptions consumed what the stripe source published: through Kafka to
		// the ledger, through Pub/Sub and SQS to aws_payments.
		pool := pgtest.Pool(t, 1)
		count := func(table string) (n int) {
			require.NoError(t, pool.QueryRow(t.Context(), "SELECT count(*) FROM "+table).Scan(&n))
			return n
		}
		w.Until(t, 30*time.Second, "the ledger row and the aws_payments row", func() bool { return count(ledger) >= 1 && count(aws) >= 1 })
		require.Equal(t, 1, count(ledger))
		require.Equal(t, 1, count(aws))
		require.Equal(t, 1, count(schema+"_dev.gcp_payments"))
	}

	code, _ := stopIdemd(t, p, 30*time.Second)
	require.Equal(t, 0, code)
}

// TestDevDatabaseURLShownAlike: `idemd --help` (the variable's help) and `idemd dev --help`
// (databaseURLDev) give dev's database the same way.
func TestDevDatabaseURLShownAlike(t *testing.T) {
	t.Parallel()
	for _, v := range envVars() {
		if v.Name == "IDEMD_DATABASE_URL" {
			require.Contains(t, v.Help, "dev: "+databaseURLDev+")")
			return
		}
	}
	t.Fatal("no IDEMD_DATABASE_URL")
}

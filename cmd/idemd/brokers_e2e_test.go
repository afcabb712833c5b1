package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/internal/pgtest"
	"github.com/idemd/idemd/internal/proctest"
	"github.com/idemd/idemd/internal/pubsubtest"
	"github.com/idemd/idemd/internal/sqstest"
	"github.com/idemd/idemd/outbox"
)

// TestBrokersEndToEnd (issue 13): through the binary, a signed webhook is applied and
// published to a Pub/Sub topic; a Pub/Sub subscription applies it and publishes it to an
// SQS FIFO queue; an SQS subscription applies it. Each hop's effect runs once per event,
// although every webhook is sent twice, and the events of one key reach the last hop in the
// order they were sent. The subscriptions deduplicate on the operation-id attribute, the id
// the relay gives each event and keeps if it publishes it again.
//
// The SQS hop's events all go to one FIFO group (the key is the events' "object" field):
// goaws locks one group at a time, so that with two groups in flight a later message of a
// group can overtake an earlier one (docs/brokers.md). With the customer as the group, this
// test failed once in CI that way: cus_a's evt_2 before evt_1 at the SQS hop.
func TestBrokersEndToEnd(t *testing.T) {
	t.Parallel()
	schema := testSchema(t)
	pool := pgtest.Pool(t, 2)
	ctx := context.Background()
	app := schema + "_app" // lower case letters, digits and _: no quoting needed in the YAML's SQL
	_, err := pool.Exec(ctx, "CREATE SCHEMA "+app+"; CREATE TABLE "+app+".hops (seq bigserial PRIMARY KEY, hop text NOT NULL, message_id text NOT NULL, event text NOT NULL, key text NOT NULL)")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA "+app+" CASCADE") })

	topic := pubsubtest.Topic(t)
	sub := pubsubtest.Subscription(t, topic, pubsubtest.SubscriptionConfig{Ordered: true})
	queue := sqstest.FIFOQueue(t, nil)

	effect := func(hop string) string {
		return fmt.Sprintf(`{sql: "INSERT INTO %s.hops (hop, message_id, event, key) VALUES ('%s', @message_id, @payload::jsonb #>> '{id}', @payload::jsonb #>> '{data,object,id}')"}`, app, hop)
	}
	file := filepath.Join(t.TempDir(), "idemd.yaml")
	require.NoError(t, os.WriteFile(file, []byte(fmt.Sprintf(`sources:
  - name: shop
    verify: {scheme: stripe, secrets_env: [E2E_STRIPE_SECRET]}
    effect: %[1]s
    publish: {pubsub: {topic: %[4]s}, key: {json: /data/object/id}}
subscriptions:
  - name: gcp
    pubsub: {subscription: %[5]s}
    message_id: {attribute: operation-id}
    effect: %[2]s
    publish: {sqs: {queue: %[6]s}, key: {json: /object}}
  - name: aws
    sqs: {queue: %[6]s}
    message_id: {attribute: operation-id}
    effect: %[3]s
`, effect("webhook"), effect("pubsub"), effect("sqs"), topic, sub, queue)), 0o600))
	httpAddr, adminAddr := proctest.FreeAddr(t), proctest.FreeAddr(t)
	p := startIdemd(t, map[string]string{
		"IDEMD_DATABASE_URL": pgtest.URL(), "IDEMD_PIPELINES_FILE": file, "IDEMD_DB_SCHEMA": schema,
		"IDEMD_DB_MAX_CONNS": "8", "IDEMD_HTTP_ADDR": httpAddr, "IDEMD_ADMIN_ADDR": adminAddr,
		"IDEMD_SHUTDOWN_TIMEOUT": "10s", "IDEMD_ROLES": "receiver,consumer,relay",
		"PUBSUB_EMULATOR_HOST": pubsubtest.Addr(t), "PUBSUB_PROJECT_ID": pubsubtest.Project,
		"AWS_ENDPOINT_URL_SQS": sqstest.Endpoint(t), "AWS_REGION": "us-east-1",
		"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
		"E2E_STRIPE_SECRET": stripeSecret,
	}, "serve")
	waitReady(t, p, adminAddr)
	w := pgtest.Watch(t, schema+"_app.hops")

	// Two keys: cus_a gets three events, cus_b one; every webhook is sent twice.
	events := []struct{ id, key string }{{"evt_1", "cus_a"}, {"evt_2", "cus_a"}, {"evt_3", "cus_b"}, {"evt_4", "cus_a"}}
	for _, e := range events {
		body := fmt.Sprintf(`{"id":%q,"object":"event","type":"customer.updated","data":{"object":{"id":%q}}}`, e.id, e.key)
		for range 2 {
			resp, err := http.DefaultClient.Do(stripeRequest(t, "http://"+httpAddr+"/webhooks/shop", stripeSecret, []byte(body)))
			require.NoError(t, err)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
		}
	}
	count := func(hop string) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+app+".hops WHERE hop = $1", hop).Scan(&n))
		return n
	}
	w.Until(t, 90*time.Second, "every event through the three hops", func() bool { return count("sqs") >= len(events) })

	for _, hop := range []string{"webhook", "pubsub", "sqs"} {
		require.Equal(t, len(events), count(hop), "one effect per event at the %s hop", hop)
	}
	// The subscriptions' message ids are the operation ids of the events they received.
	for _, e := range events {
		var pubsubID, sqsID string
		require.NoError(t, pool.QueryRow(ctx, "SELECT message_id FROM "+app+".hops WHERE hop = 'pubsub' AND event = $1", e.id).Scan(&pubsubID))
		require.NoError(t, pool.QueryRow(ctx, "SELECT message_id FROM "+app+".hops WHERE hop = 'sqs' AND event = $1", e.id).Scan(&sqsID))
		require.Equal(t, outbox.OperationID("shop", e.id, 0).String(), pubsubID, "%s: the webhook's event id on Pub/Sub", e.id)
		require.Equal(t, outbox.OperationID("gcp", pubsubID, 0).String(), sqsID, "%s: the subscription's event id on SQS", e.id)
	}
	// Key order at the last hop: cus_a's events in the order they were sent (one Pub/Sub
	// ordering key per customer; one SQS group for all).
	rows, err := pool.Query(ctx, "SELECT event FROM "+app+".hops WHERE hop = 'sqs' AND key = 'cus_a' ORDER BY seq")
	require.NoError(t, err)
	order, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"evt_1", "evt_2", "evt_4"}, order, "cus_a's events in order at the SQS hop")
	code, _ := stopIdemd(t, p, 30*time.Second)
	require.Equal(t, 0, code)
}

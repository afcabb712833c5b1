package admin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"

	"github.com/idemd/idemd/consumer"
	"github.com/idemd/idemd/internal/kafkatest"
	"github.com/idemd/idemd/pipeline"
)

// versioned posts a webhook of entity A at version v to the source "versions" and returns
// the status it was answered with.
func (b *bundle) versioned(t *testing.T, id string, v int) string {
	t.Helper()
	res, err := http.Post(b.hooks.URL+"/webhooks/versions", "application/json",
		strings.NewReader(fmt.Sprintf(`{"id":%q,"entity":"A","version":%d}`, id, v)))
	require.NoError(t, err)
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	var answer struct {
		Status string `json:"status"`
	}
	require.NoError(t, json.Unmarshal(raw, &answer), "%s", raw)
	return answer.Status
}

// story returns the story of a message of pipeline, and its effect.
func (b *bundle) story(t *testing.T, pipeline, id string) (story, effect map[string]any) {
	t.Helper()
	r := b.get(t, "/api/v1/messages/"+pipeline+"/"+id)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	story = r.json(t)
	return story, story["effect"].(map[string]any)
}

// requireStale checks the story of a stale message of entity A at version v: its record
// and effect say stale, and why, with the version the entity is at now.
func (b *bundle) requireStale(t *testing.T, pipeline, id string, v int, now string) {
	t.Helper()
	story, effect := b.story(t, pipeline, id)
	require.Equal(t, "stale", story["status"], id)
	require.Equal(t, "stale", effect["outcome"], id)
	require.Equal(t, "A", effect["entity"], id)
	require.Equal(t, fmt.Sprint(v), effect["version"], id)
	require.Contains(t, effect["reason"], fmt.Sprintf(`version %d of entity "A" was not newer than the last applied one`, v), id)
	require.Contains(t, effect["reason"], now, id)
}

// requireApplied checks the story of an applied message.
func (b *bundle) requireApplied(t *testing.T, pipeline, id string) {
	t.Helper()
	story, effect := b.story(t, pipeline, id)
	require.Equal(t, "processed", story["status"], id)
	require.Equal(t, map[string]any{"outcome": "applied"}, effect, id)
}

// replayLetter replays the one dead letter of pipeline through the admin API, and checks
// what the replay says it did with the message (effect).
func (b *bundle) replayLetter(t *testing.T, pipeline, effect string) {
	t.Helper()
	letters := b.get(t, "/api/v1/dead-letters?pipeline="+pipeline).data(t)
	require.Len(t, letters, 1)
	r := b.call(t, "POST", fmt.Sprintf("/api/v1/dead-letters/%v/replay", letters[0]["id"]), testToken, nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Equal(t, "replayed", r.json(t)["outcome"], "%s", r.body)
	require.Equal(t, effect, r.json(t)["effect"], "%s", r.body)
}

// A webhook older than its entity's last applied one is answered stale, and its story says
// so — not applied — in the API and on the console, and why; the list filters by it. A
// resend of it is still a duplicate, and a dead letter replayed after a newer version was
// applied reads stale too.
func TestStaleWebhookStory(t *testing.T) {
	t.Parallel()
	b := setup(t, options{tokens: testToken})
	require.Equal(t, "dead_lettered", b.versioned(t, "w1", 1), "the gate is closed")
	b.db.Exec(t, b.db.Q(`INSERT INTO {schema}.gate VALUES (1)`))
	require.Equal(t, "processed", b.versioned(t, "w3", 3))
	require.Equal(t, "stale", b.versioned(t, "w2", 2))
	require.Equal(t, "duplicate", b.versioned(t, "w2", 2), "a stale webhook sent again")

	b.requireApplied(t, "versions", "w3")
	b.requireStale(t, "versions", "w2", 2, `the entity is at version 3 now, applied by message "w3"`)
	require.Equal(t, []string{"w2"}, ids(b.get(t, "/api/v1/messages?pipeline=versions&outcome=stale").data(t), "message_id"))
	require.Equal(t, []string{"w3"}, ids(b.get(t, "/api/v1/messages?pipeline=versions&outcome=processed").data(t), "message_id"))

	b.replayLetter(t, "versions", "stale")
	b.requireStale(t, "versions", "w1", 1, `the entity is at version 3 now, applied by message "w3"`)
	require.Equal(t, []string{"w2", "w1"}, ids(b.get(t, "/api/v1/messages?pipeline=versions&outcome=stale").data(t), "message_id"))
	require.Equal(t, 1, b.db.Count(t, "{schema}.effects"), "only w3 applied")

	page := string(b.get(t, "/ui/messages/versions/w2").body)
	require.Contains(t, page, `<span class="state state-stale" id="outcome">stale</span>`)
	require.Contains(t, page, `stale: version 2 of entity &#34;A&#34; was not newer than the last applied one`)
	list := string(b.get(t, "/ui/messages?pipeline=versions&outcome=stale").body)
	require.Contains(t, list, "<option selected>stale</option>")
	require.Contains(t, list, ">w2</a>")
	require.NotContains(t, list, ">w3</a>")
}

// The same for a Kafka subscription: a record older than its entity's last applied one is
// acknowledged without its effect, and its story says stale; a redelivery of it is
// acknowledged with no effect and its story unchanged; a dead letter replayed after a
// newer version was applied reads stale.
func TestStaleSubscriptionStory(t *testing.T) {
	t.Parallel()
	b := setup(t, options{tokens: testToken})
	brokers, topic := kafkatest.Brokers(t), kafkatest.Topic(t, 1)
	commits := kafkatest.NewCommitLog()
	committed := func(n int64) {
		commits.Wait(t, 30*time.Second, 1, func(offs []int64) bool { return offs[0] >= n })
	}
	quiet := logrus.New()
	quiet.SetOutput(io.Discard)
	c, err := consumer.New(b.db.Pool, &consumer.Config{
		Name:              "ledger",
		Brokers:           brokers,
		Topics:            []string{topic},
		Group:             kafkatest.Group(t),
		Schema:            b.db.Schema,
		Effect:            consumer.Effect{SQL: b.db.Q(gatedEffect)},
		Order:             &pipeline.Order{Entity: pipeline.Field{JSON: "/entity"}, Version: pipeline.Field{JSON: "/version"}},
		DeadLetter:        pipeline.DeadLetter{MaxAttempts: 1},
		HeartbeatInterval: 100 * time.Millisecond,
		SessionTimeout:    6 * time.Second,
		RebalanceTimeout:  5 * time.Second,
		BackoffMin:        5 * time.Millisecond,
		BackoffMax:        50 * time.Millisecond,
		Logger:            logrus.NewEntry(quiet),
		OnOffsetCommit:    commits.Record,
	})
	require.NoError(t, err)
	c.RegisterReplay(b.rp)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireAll}
	t.Cleanup(func() { w.Close() })
	produce := func(id string, v int) {
		require.NoError(t, w.WriteMessages(context.Background(), kafka.Message{
			Headers: []kafka.Header{{Key: "operation-id", Value: []byte(id)}},
			Value:   []byte(fmt.Sprintf(`{"entity":"A","version":%d}`, v)),
		}))
	}

	produce("k1", 1)
	committed(1) // dead-lettered: the gate is closed
	b.db.Exec(t, b.db.Q(`INSERT INTO {schema}.gate VALUES (1)`))
	produce("k3", 3)
	produce("k2", 2)
	committed(3)
	b.requireApplied(t, "ledger", "k3")
	b.requireStale(t, "ledger", "k2", 2, `the entity is at version 3 now, applied by message "k3"`)

	produce("k2", 2)
	committed(4)
	b.requireStale(t, "ledger", "k2", 2, `applied by message "k3"`)
	require.Equal(t, 1, b.db.Count(t, "{schema}.effects"), "only k3 applied, once")
	require.Equal(t, []string{"k2"}, ids(b.get(t, "/api/v1/messages?pipeline=ledger&outcome=stale").data(t), "message_id"))

	b.replayLetter(t, "ledger", "stale")
	b.requireStale(t, "ledger", "k1", 1, `applied by message "k3"`)
	require.Equal(t, 1, b.db.Count(t, "{schema}.effects"))
	require.Equal(t, []string{"k3"}, ids(b.get(t, "/api/v1/messages?pipeline=ledger&outcome=processed").data(t), "message_id"))
}

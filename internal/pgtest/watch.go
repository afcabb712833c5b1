package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Watcher is a signal from the database: it wakes a test each time a transaction that
// changed one of the watched tables commits, so that a test whose effects happen in another
// process (an idemd subprocess) waits for them without polling.
type Watcher struct {
	conn    *pgx.Conn
	channel string
}

// Watch makes every statement that inserts, updates or deletes rows of the tables (each
// "schema.table") notify a channel of its own when its transaction commits, and listens on
// it. The statement-level triggers it adds are dropped at cleanup.
func Watch(tb testing.TB, tables ...string) *Watcher {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var b [6]byte
	_, _ = rand.Read(b[:])
	w := &Watcher{channel: "pgtest_watch_" + hex.EncodeToString(b[:])}
	conn, err := pgx.Connect(ctx, URL())
	if err != nil {
		tb.Fatalf("pgtest: watch: %v", redactErr(err))
	}
	w.conn = conn
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, t := range tables {
			_, _ = conn.Exec(ctx, "DROP TRIGGER IF EXISTS "+w.channel+" ON "+t)
		}
		_ = conn.Close(ctx)
	})
	if _, err := conn.Exec(ctx, "LISTEN "+w.channel); err != nil {
		tb.Fatalf("pgtest: watch: %v", err)
	}
	// One notifying function, shared by every test: CREATE OR REPLACE under an advisory
	// lock, as concurrent replaces of one function conflict ("tuple concurrently updated").
	// The statements run in one implicit transaction, so the lock is the transaction's, held
	// until the replace has committed: a session lock unlocked by the last statement was
	// released before the commit, and the next test's replace could still meet this one's.
	_, err = conn.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('pgtest.watch'));
CREATE OR REPLACE FUNCTION public.pgtest_watch_notify() RETURNS trigger LANGUAGE plpgsql AS
$$ BEGIN PERFORM pg_notify(TG_ARGV[0], ''); RETURN NULL; END $$`)
	if err != nil {
		tb.Fatalf("pgtest: watch: %v", err)
	}
	for _, t := range tables {
		_, err := conn.Exec(ctx, fmt.Sprintf(`CREATE TRIGGER %s AFTER INSERT OR UPDATE OR DELETE ON %s
FOR EACH STATEMENT EXECUTE FUNCTION public.pgtest_watch_notify('%s')`, w.channel, t, w.channel))
		if err != nil {
			tb.Fatalf("pgtest: watch %s: %v", t, err)
		}
	}
	return w
}

// Until returns once cond holds. It checks cond at once and again after each commit that
// changed a watched table (cond usually counts rows); it fails the test, saying what it
// waited for, when timeout passes first.
func (w *Watcher) Until(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := w.Wait(ctx, cond); err != nil {
		tb.Fatalf("pgtest: waiting %s for %s: %v", timeout, what, err)
	}
}

// Wait is Until for callers with a context of their own: it returns ctx's error when ctx
// ends before cond holds.
func (w *Watcher) Wait(ctx context.Context, cond func() bool) error {
	for !cond() {
		if _, err := w.conn.WaitForNotification(ctx); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
	}
	return nil
}

func redactErr(err error) string { return redact(err.Error()) }

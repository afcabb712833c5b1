package main

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The amplification section's logical variant measures the third option for an
// outbox that writes nothing per row: each event a transactional logical decoding message
// (pg_logical_emit_message) instead of an outbox row, read by a relay from a logical
// replication slot, as Debezium's outbox does. The writer's side is the limit's statement
// with the outbox insert replaced (limitSQL); the reader's side is a loop that takes what
// the slot holds through pgoutput with messages on and no table published, so that it
// receives the messages alone, as such a relay would, while PostgreSQL still decodes every
// change of every transaction to find them. Its backend counts as the limit's (CPU
// accounting), as the relay-like delete loop's does. It needs wal_level=logical, which
// changes what every write logs: the section says so and runs it only on such a server.

// logicalPrefix is the prefix of the bench's logical messages.
const logicalPrefix = "idemd-outbox"

// walLevel is the server's wal_level.
func (e *env) walLevel(ctx context.Context) (string, error) {
	var level string
	err := e.pool.QueryRow(ctx, "SHOW wal_level").Scan(&level)
	return level, err
}

// logicalSlot is a temporary logical replication slot and the publication its reader
// names, read on one connection of the limit's pool.
type logicalSlot struct {
	name, publication string
	conn              *pgxpool.Conn
	// messages counts the logical messages decoded so far.
	messages atomic.Int64
	done     chan struct{}
	err      error // of the loop, once done is closed
}

// newLogicalSlot creates the publication (no table) and, on a connection of pool, a
// temporary slot, which goes with that connection: none is left behind to hold WAL back.
func (e *env) newLogicalSlot(ctx context.Context, pool *pgxpool.Pool) (*logicalSlot, error) {
	s := &logicalSlot{name: "idemd_bench_" + e.runID, publication: "idemd_bench_" + e.runID + "_events", done: make(chan struct{})}
	if _, err := e.pool.Exec(ctx, "CREATE PUBLICATION "+pgx.Identifier{s.publication}.Sanitize()); err != nil {
		return nil, fmt.Errorf("creating the logical variant's publication: %w", err)
	}
	conn, err := pool.Acquire(ctx)
	if err == nil {
		_, err = conn.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput', true)`, s.name)
		if err != nil {
			conn.Release()
		}
	}
	if err != nil {
		s.dropPublication(ctx, e.pool)
		return nil, fmt.Errorf("creating the logical variant's slot: %w", err)
	}
	s.conn = conn
	return s, nil
}

// decodeLoop takes what the slot holds until ctx ends, counting the messages.
func (s *logicalSlot) decodeLoop(ctx context.Context) {
	defer close(s.done)
	for ctx.Err() == nil {
		var rows, msgs int64
		// pgoutput's protocol: a message is a row whose first byte is 'M'.
		err := s.conn.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE get_byte(data, 0) = 77)
FROM pg_logical_slot_get_binary_changes($1, NULL, NULL, 'proto_version', '1', 'publication_names', $2, 'messages', 'true')`,
			s.name, s.publication).Scan(&rows, &msgs)
		if err != nil {
			if ctx.Err() == nil {
				s.err = fmt.Errorf("decoding the slot: %w", err)
			}
			return
		}
		s.messages.Add(msgs)
		if rows == 0 {
			select {
			case <-ctx.Done():
			case <-time.After(time.Millisecond):
			}
		}
	}
}

// waitDecoded returns once want messages were decoded, or the loop failed.
func (s *logicalSlot) waitDecoded(ctx context.Context, want int) error {
	deadline := time.Now().Add(2 * time.Minute)
	for s.messages.Load() < int64(want) {
		select {
		case <-s.done:
			return cmpErr(s.err, errors.New("the slot's reader stopped"))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("decoded %d of %d logical messages in 2 minutes", s.messages.Load(), want)
		}
	}
	return nil
}

// close waits for the loop (its ctx ended), then releases the connection (the temporary
// slot goes with it: the connection is closed, not returned) and drops the publication.
func (s *logicalSlot) close(ctx context.Context, pool *pgxpool.Pool) error {
	<-s.done
	c := s.conn.Hijack()
	err := c.Close(ctx)
	s.dropPublication(ctx, pool)
	return cmpErr(s.err, err)
}

func (s *logicalSlot) dropPublication(ctx context.Context, pool *pgxpool.Pool) {
	_, _ = pool.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{s.publication}.Sanitize())
}

package processed

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/google/uuid"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Completion marks one claimed id as finished.
type Completion struct {
	Scope     string
	MessageID string
	// State is StateDone or StateDead.
	State State
	// Response, when set, is stored and returned to later duplicates.
	Response *Response
	// LeaseToken, for a reservation (Claim.Reserve), is the token its claim returned: the
	// completion then succeeds only if the reservation was not taken over meanwhile, and
	// fails with ErrLeaseLost otherwise.
	LeaseToken uuid.UUID
}

// CompleteTx marks (scope, id) done with an optional response, on the default schema.
func CompleteTx(ctx context.Context, tx pgx.Tx, scope, id string, resp *Response) error {
	return Default.CompleteTx(ctx, tx, scope, id, resp)
}

// CompleteTx marks (scope, id) done with an optional response.
func (s *Store) CompleteTx(ctx context.Context, tx pgx.Tx, scope, id string, resp *Response) error {
	return s.CompleteBatchTx(ctx, tx, []Completion{{Scope: scope, MessageID: id, State: StateDone, Response: resp}})
}

// CompleteBatchTx finishes many claims in one statement.
func (s *Store) CompleteBatchTx(ctx context.Context, tx pgx.Tx, done []Completion) error {
	if len(done) == 0 {
		return nil
	}
	n := len(done)
	var (
		scopes   = make([]string, n)
		ids      = make([]string, n)
		states   = make([]string, n)
		statuses = make([]*int32, n)
		bodies   = make([][]byte, n)
		// Headers as JSON text and tokens as text: a []map[string]string and a []*uuid.UUID
		// do not encode where pgx does not know the parameters' types (QueryExecModeExec, the
		// simple protocol: TestCommitInTheLastRoundTripEveryExecMode).
		headers = make([]*string, n)
		tokens  = make([]*string, n)
		leased  bool
	)
	for i, d := range done {
		if d.State != StateDone && d.State != StateDead {
			return fmt.Errorf("processed: completion %d has state %q, want done or dead", i, d.State)
		}
		scopes[i], ids[i], states[i] = d.Scope, d.MessageID, string(d.State)
		if d.LeaseToken != uuid.Nil {
			tok := d.LeaseToken.String()
			tokens[i], leased = &tok, true
		}
		if d.Response != nil {
			st := int32(d.Response.Status)
			statuses[i], bodies[i] = &st, d.Response.Body
			if d.Response.Headers != nil {
				h, err := json.Marshal(d.Response.Headers)
				if err != nil {
					return fmt.Errorf("processed: completion %d: encoding the answer's headers: %w", i, err)
				}
				hs := string(h)
				headers[i] = &hs
			}
		}
	}
	var tag pgconn.CommandTag
	err := sendByIndex(ctx, tx, func(b *pgx.Batch) {
		queueExec(b, &tag, s.sql.complete, scopes, ids, states, statuses, headers, bodies, tokens)
	})
	if err != nil {
		return fmt.Errorf("error completing messages: %w", err)
	}
	if int(tag.RowsAffected()) != n && leased {
		return fmt.Errorf("processed: completed %d of %d messages: %w", tag.RowsAffected(), n, ErrLeaseLost)
	}
	if int(tag.RowsAffected()) != n {
		return fmt.Errorf("processed: completed %d of %d messages: a claim is missing from this transaction", tag.RowsAffected(), n)
	}
	return nil
}

// ReplayedTx marks (scope, id) done in tx, the transaction in which a replay of its dead
// letter applied its effect: the record said dead (the effect failed for good), and now
// the effect is applied. A record in another state is left as it is.
func (s *Store) ReplayedTx(ctx context.Context, tx pgx.Tx, scope, id string) error {
	if err := sendByIndex(ctx, tx, func(b *pgx.Batch) { b.Queue(s.sql.replayed, scope, id) }); err != nil {
		return fmt.Errorf("error marking the replayed message done: %w", err)
	}
	return nil
}

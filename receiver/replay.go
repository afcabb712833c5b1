package receiver

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/deadletter"
	"github.com/idemd/idemd/processed"
)

// ErrAlreadyReplayed: the dead letter was replayed before; its effect is not run again.
var ErrAlreadyReplayed = deadletter.ErrAlreadyReplayed

// ErrUnknownSource: the dead letter's pipeline is not a source of this receiver.
var ErrUnknownSource = errors.New("dead letter's pipeline is not a source of this receiver")

// Replay runs a dead-lettered webhook's effect (and publish) again through its source, for
// `idemd dlq replay`, once the cause was fixed. The request is not verified again: it was
// when it arrived. Exactly once: the letter is locked, its effect runs and the letter is
// marked replayed in one transaction, so two replays of one letter apply it once (the second
// gets ErrAlreadyReplayed). A replay that fails again commits nothing and returns the error.
func (r *Receiver) Replay(ctx context.Context, letterID int64) error {
	return r.letters.Replay(ctx, r.pool, letterID, func(ctx context.Context, tx pgx.Tx, l *deadletter.Letter) error {
		src := r.byName[l.Pipeline]
		// Letters of the outbound paths (relay, HTTP sink) carry their source's pipeline
		// name too: running the source's effect for them would apply it twice.
		if door, _ := l.Metadata["door"].(string); door != "" && door != "http" {
			src = nil
		}
		if src == nil {
			return fmt.Errorf("dead letter %d (pipeline %q): %w", letterID, l.Pipeline, ErrUnknownSource)
		}
		c := replayCall(src, l)
		if _, err := r.runEffect(ctx, tx, c); err != nil {
			return fmt.Errorf("error replaying dead letter %d: %w", letterID, err)
		}
		return nil
	})
}

func replayCall(src *source, l *deadletter.Letter) *call {
	str := func(k string) string { s, _ := l.Metadata[k].(string); return s }
	req := &Request{
		Source: src.name, Tenant: str("tenant"), MessageID: l.MessageID, Method: str("method"),
		Path: str("path"), Header: l.Headers, Body: l.Payload, ReceivedAt: l.CreatedAt,
	}
	c := &call{src: src, req: req, body: &parsedBody{raw: l.Payload}, scope: l.Scope}
	c.eventType = src.eventType(http.Header(l.Headers), c.body)
	if c.scope == "" {
		c.scope = processed.Scope(src.name, req.Tenant)
	}
	return c
}

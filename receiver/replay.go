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

// ErrUnknownSource: the dead letter's pipeline is not a source of this receiver.
var ErrUnknownSource = errors.New("dead letter's pipeline is not a source of this receiver")

// RegisterReplay tells rp how the receiver's letters (deadletter.DoorHTTP) are replayed:
// the dead-lettered webhook's effect and event run again through its source and the unit of
// work, once the cause was fixed. The request is not verified again: it was when it arrived.
// Its event keeps the operation id it would have had, so a downstream consumer deduplicates
// it against an earlier copy.
//
// A replay that commits counts as the source's webhooks do when they arrive: applied
// (idemd_messages_processed_total) or stale (idemd_messages_stale_total), and in
// idemd_dead_letters_replayed_total (deadletter.Replayer.Replay).
func (r *Receiver) RegisterReplay(rp *deadletter.Replayer) {
	rp.Register(deadletter.DoorHTTP, "", r.replay)
	for name := range r.byName {
		rp.Expect(deadletter.DoorHTTP, name, deadletter.ReplayApplied, deadletter.ReplayStale)
	}
}

func (r *Receiver) replay(ctx context.Context, tx pgx.Tx, l *deadletter.Letter) (deadletter.Replayed, error) {
	src := r.byName[l.Pipeline]
	if src == nil {
		return deadletter.Replayed{}, fmt.Errorf("dead letter %d (pipeline %q): %w", l.ID, l.Pipeline, ErrUnknownSource)
	}
	m := src.message(replayCall(src, l))
	outcome, err := r.unit.ReplayTx(ctx, tx, m, false)
	if err != nil {
		return deadletter.Replayed{}, fmt.Errorf("error replaying dead letter %d: %w", l.ID, err)
	}
	done := fmt.Sprintf("replayed through source %q", src.name)
	if outcome == deadletter.ReplayStale {
		done += ": stale message, effect skipped"
	}
	return deadletter.Replayed{Outcome: outcome, Done: done}, nil
}

// replayCall rebuilds the call of a dead-lettered request from its letter.
func replayCall(src *source, l *deadletter.Letter) *call {
	str := func(k string) string { s, _ := l.Metadata[k].(string); return s }
	req := &Request{
		Source: src.name, Tenant: str(deadletter.MetaTenant), MessageID: l.MessageID, Method: str(deadletter.MetaMethod),
		Path: str(deadletter.MetaPath), Header: l.Headers, Body: l.Payload, ReceivedAt: l.CreatedAt,
	}
	c := &call{src: src, req: req, body: &parsedBody{raw: l.Payload}, scope: l.Scope}
	c.eventType = src.eventType(http.Header(l.Headers), c.body)
	if c.scope == "" {
		c.scope = processed.Scope(src.name, req.Tenant)
	}
	return c
}

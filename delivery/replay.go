package delivery

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/deadletter"
)

// RegisterReplay tells rp how HTTP deliveries' letters (deadletter.DoorDelivery) are
// replayed: the delivery is made pending again, with the same operation id, and the letter
// marked replayed in one transaction, under the letter's lock, so that two replays cannot
// requeue it twice.
func (s *Store) RegisterReplay(rp *deadletter.Replayer) {
	rp.Register(deadletter.DoorDelivery, "", s.replay)
}

func (s *Store) replay(ctx context.Context, tx pgx.Tx, l *deadletter.Letter) (deadletter.Replayed, error) {
	id := l.Origin.DeliveryID
	if id == 0 {
		return deadletter.Replayed{}, fmt.Errorf("dead letter %d names no delivery", l.ID)
	}
	if err := s.RequeueTx(ctx, tx, id); err != nil {
		if errors.Is(err, ErrNotFound) {
			return deadletter.Replayed{}, fmt.Errorf("delivery %d no longer exists (pruned?); the payload is in `idemd dlq list -json`", id)
		}
		return deadletter.Replayed{}, err
	}
	endpoint, _ := l.Metadata["endpoint"].(string)
	return deadletter.Replayed{
		Outcome: deadletter.ReplayRequeued,
		Done:    fmt.Sprintf("delivery %d requeued to endpoint %q with the same operation id", id, endpoint),
	}, nil
}

package processed

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/idemd/idemd/internal/pgarray"
)

// AfterConnect is for pgxpool.Config.AfterConnect (or call it on a pgx.Conn you open): the
// connection then encodes the arrays of idemd's batch statements (claims, outbox rows,
// multi-message effects) in one pass, as the daemon's connections do. It is optional:
// without it pgx encodes them element by element, to the same bytes, with about four
// times the CPU and twice the garbage (BENCHMARKS.md, phase 14). It changes nothing else
// on the connection.
func AfterConnect(ctx context.Context, c *pgx.Conn) error { return pgarray.AfterConnect(ctx, c) }

package processed

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/bits-and-blooms/bloom/v3"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sirupsen/logrus"
)

// An EpochFilter spares a claim the lookup of its new ids in the older epochs (queries.go,
// knownOlder): one primary-key descent per new id per older epoch, which cost the consumer
// 6-19 % of its rate on a million records (BENCHMARKS.md, phases 28 to 30). It holds a Bloom
// filter of the ids of every epoch below the current one; a claim looks in the older
// partitions only for the ids the filter may hold, about one new id in a hundred.
//
// Guarantee: a claim skips the lookup only when the filter holds every id that the older
// epochs can ever hold, so no id of the retention is missed. An epoch below the current one
// takes no new record: OpenEpoch opens the next epoch under the epochs' lock held
// exclusively, after every claim that inserted into the one before has ended (epochs.go),
// and a claim inserts only into the current epoch. Its ids can only leave (taken over into
// the current epoch, released, pruned), which the filter sees as false positives, a lookup
// for nothing. So Refresh reads the epochs and the older epochs' ids in one snapshot, and
// the claim's statement checks, in its own snapshot, that the current epoch is still the
// one the filter was built under (its number and when it opened): when another has opened
// since, or the filter is stale or missing, every new id is looked up, as without a filter.
//
// One EpochFilter serves every Store of its schema in a process (Config.Filter); Run keeps
// it current. A Store without one looks every new id up.
type EpochFilter struct {
	schema   string
	maxBytes int64
	set      atomic.Pointer[epochSet]
	// ids is the number of ids in the filter now, for metrics.
	ids atomic.Int64
}

// epochSet is the filter as built under one current epoch.
type epochSet struct {
	// epoch is the current epoch when it was built, and opened when that epoch opened: a
	// claim uses the filter only while its statement sees the same.
	epoch  int32
	opened time.Time
	// oldest is the oldest live epoch then: a newer one means epochs were dropped, and a
	// rebuild leaves their ids out.
	oldest int32
	// filter holds the ids of every epoch below epoch; nil when there was none, or when it
	// would not fit in maxBytes (then every id may be there).
	filter *bloom.BloomFilter
	all    bool
}

// mayHold reports whether the older epochs may hold key (appendKey's): false only when
// they certainly do not.
func (s *epochSet) mayHold(key []byte) bool {
	switch {
	case s.all:
		return true
	case s.filter == nil:
		return false
	default:
		return s.filter.Test(key)
	}
}

// FilterFalsePositives is the share of the new ids that the filter sends to the older
// epochs' lookup for nothing. At this rate a Bloom filter takes about 9.6 bits (1.2 bytes)
// per id.
const FilterFalsePositives = 0.01

// FilterMaxBytesDefault bounds a filter's memory when NewEpochFilter is given none: 64 MiB,
// the ids of about 55 million records in the older epochs.
const FilterMaxBytesDefault = 64 << 20

// NewEpochFilter returns an empty filter of schema's epochs (claims look every id up until
// its first Refresh), which takes at most maxBytes of memory (0: FilterMaxBytesDefault). When
// the older epochs hold more ids than fit, Refresh builds none, and claims look every new id
// up.
func NewEpochFilter(schema string, maxBytes int64) *EpochFilter {
	if maxBytes <= 0 {
		maxBytes = FilterMaxBytesDefault
	}
	if schema == "" {
		schema = Default.schema
	}
	return &EpochFilter{schema: schema, maxBytes: maxBytes}
}

// Schema returns the schema whose epochs f holds.
func (f *EpochFilter) Schema() string { return f.schema }

// IDs returns how many ids the filter holds (0 when it holds none, or when they did not fit).
func (f *EpochFilter) IDs() int64 { return f.ids.Load() }

// load returns the filter's set, nil before the first Refresh (or on a nil f).
func (f *EpochFilter) load() *epochSet {
	if f == nil {
		return nil
	}
	return f.set.Load()
}

// FilterRefresh is what one Refresh did.
type FilterRefresh struct {
	// Built is true when the filter was built again: the current or the oldest epoch had
	// changed since the last build.
	Built bool
	// Epoch is the current epoch, and IDs how many ids the older epochs held.
	Epoch int32
	IDs   int64
	// TooLarge: the ids would not fit in the filter's bytes, and claims look every new id up.
	TooLarge bool
	// Took is how long the build took.
	Took time.Duration
}

// Refresh builds the filter again when the current epoch or the oldest one changed since it
// was last built: it reads the epochs and every id of the older ones in one snapshot
// (REPEATABLE READ), on one connection of pool. Until a build ends, claims use the filter
// before it where their current epoch is still its own, and look every new id up where not.
func (f *EpochFilter) Refresh(ctx context.Context, pool *pgxpool.Pool) (FilterRefresh, error) {
	began := time.Now()
	var res FilterRefresh
	epochs := pgx.Identifier{f.schema, "processed_epochs"}.Sanitize()
	table := pgx.Identifier{f.schema, "processed_messages"}.Sanitize()
	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var next epochSet
		if err := tx.QueryRow(ctx, `SELECT max(epoch), min(epoch), max(opened_at) FROM `+epochs).Scan(&next.epoch, &next.oldest, &next.opened); err != nil {
			return err
		}
		res.Epoch = next.epoch
		if cur := f.set.Load(); cur != nil && cur.epoch == next.epoch && cur.oldest == next.oldest && cur.opened.Equal(next.opened) {
			return nil
		}
		res.Built = true
		if next.oldest < next.epoch {
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE epoch < $1`, next.epoch).Scan(&res.IDs); err != nil {
				return err
			}
		}
		switch {
		case res.IDs == 0:
		case filterBytes(res.IDs) > f.maxBytes:
			next.all, res.TooLarge = true, true
		default:
			next.filter = bloom.NewWithEstimates(uint(res.IDs), FilterFalsePositives)
			rows, err := tx.Query(ctx, `SELECT scope, message_id FROM `+table+` WHERE epoch < $1`, next.epoch)
			if err != nil {
				return err
			}
			var key []byte
			for rows.Next() {
				raw := rows.RawValues()
				key = appendKey(key[:0], raw[0], raw[1])
				next.filter.Add(key)
			}
			if err := rows.Err(); err != nil {
				return err
			}
		}
		f.set.Store(&next)
		if next.filter != nil {
			f.ids.Store(res.IDs)
		} else {
			f.ids.Store(0)
		}
		return nil
	})
	res.Took = time.Since(began)
	if err != nil {
		return res, fmt.Errorf("error building the filter of the older epochs' ids: %w", err)
	}
	return res, nil
}

// filterBytes is the memory a filter of n ids takes.
func filterBytes(n int64) int64 {
	m, _ := bloom.EstimateParameters(uint(n), FilterFalsePositives)
	return int64(m / 8)
}

// FilterRefreshDefault is how often Run checks whether an epoch opened or was dropped.
// Until it sees a new epoch, claims look every new id up: correct, as slow as without a
// filter.
const FilterRefreshDefault = 10 * time.Second

// Run refreshes the filter every interval (FilterRefreshDefault when 0) until ctx ends,
// starting at once; it logs each build, and each failure as a warning (claims then go on
// with the filter they had, or with none). onBuild, when set, is called after each build.
func (f *EpochFilter) Run(ctx context.Context, pool *pgxpool.Pool, interval time.Duration, log *logrus.Entry, onBuild func(FilterRefresh)) error {
	if interval <= 0 {
		interval = FilterRefreshDefault
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		res, err := f.Refresh(ctx, pool)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			log.WithError(err).Warn("error building the filter of the older epochs' ids; claims look every new id up in the older epochs until it is built")
		case res.TooLarge:
			log.WithFields(logrus.Fields{"epoch": res.Epoch, "records": res.IDs, "bytes": filterBytes(res.IDs)}).
				Warnf("the older epochs' ids need a larger filter than its %d bytes (IDEMD_PROCESSED_FILTER_MAX_BYTES): claims look every new id up in the older epochs", f.maxBytes)
		case res.Built:
			log.WithFields(logrus.Fields{"epoch": res.Epoch, "records": res.IDs, "bytes": filterBytes(res.IDs), "duration": res.Took.Seconds()}).
				Info("built the filter of the older epochs' ids")
		}
		if err == nil && res.Built && onBuild != nil {
			onBuild(res)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// errFilterSchema: a Store was given the filter of another schema.
var errFilterSchema = errors.New("processed: Filter holds the epochs of another schema")

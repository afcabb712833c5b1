package outbox

// RelayLockKey is the advisory lock key of the relay of schema (tests take it away).
var RelayLockKey = relayLockKey

// RelaySignals are the relay's test signals, for the package's external tests.
type RelaySignals = relaySignals

// RelayRound is what one relay round did: the value of the Round signal.
type RelayRound = round

// TestSignals returns r's test signals; initialise the ones a test waits on before Run.
func (r *Relay) TestSignals() *RelaySignals { return &r.signals }

// ReadAheads is how many rounds used rows read ahead while the round before was published.
func (r *Relay) ReadAheads() int64 { return r.readAheads.Load() }

// AheadsDropped is how many rounds' rows read ahead were dropped for a key's order.
func (r *Relay) AheadsDropped() int64 { return r.aheadsDropped.Load() }

// RowsSQL is Rows' statement and arguments, for the plan tests.
func (s *Store) RowsSQL(f RowFilter) (string, []any) { return s.rowsSQL(f) }

// Floor returns the relay's floor: no row below it is unpublished (see floorFence).
func (r *Relay) Floor() int64 { return r.floorValue.Load() }

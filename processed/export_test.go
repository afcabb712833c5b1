package processed

// ListRecordsSQL is ListRecords' statement and arguments, for the plan tests.
func (s *Store) ListRecordsSQL(f RecordFilter) (string, []any) { return s.listRecordsSQL(f) }

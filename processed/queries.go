package processed

// queries are built once per Store, with the schema already quoted in.
type queries struct {
	epochLock, claimNew, claimNewShared, claim, lookup, conflict, complete, replayed, stale, acquire, release, forget, pruneConflicts, pruneConflictsExpired string
}

func newQueries(schema string) queries {
	t := schema + ".processed_messages"
	epochs := schema + ".processed_epochs"
	// e, the current epoch: the partition a claim inserts into (migration 0009), and the
	// oldest live one. The claim's transaction holds the epochs' lock in shared mode
	// (epochLock) from before this statement's snapshot, so no epoch opens meanwhile, and
	// every transaction that claimed in an older epoch has ended: what it wrote there is
	// visible. e.opened, when the current epoch opened, tells it from an epoch of the same
	// number in a schema made again (EpochFilter). All three are read by the primary key: a
	// sequential scan, which the claims turn off (byindex.go), would cost the plan past
	// jit_above_cost, and PostgreSQL would compile each claim (0.4 s; BENCHMARKS.md, phase
	// 30).
	current := `(SELECT max(epoch) AS epoch, min(epoch) AS oldest,
        (SELECT opened_at FROM ` + epochs + ` ORDER BY epoch DESC LIMIT 1) AS opened FROM ` + epochs + `) e`
	// k.known: the claim's id is in an older epoch, so the claim does not insert it. A
	// lateral probe of each older partition's primary key, by id; PostgreSQL prunes the
	// partitions that are not older when it runs. A NOT EXISTS let the planner hash the
	// whole table instead, a sequential scan per claim: the consumer ran at a third of its
	// rate (BENCHMARKS.md, phase 26). With one epoch (the first retention of an install,
	// or epochs off) there is nothing older: e.oldest < e.epoch gates the probe, checked
	// once per id without reading the index. PostgreSQL plans a table of one partition as
	// that partition alone, with no pruning left to do when it runs, and probed it for
	// every new id (BENCHMARKS.md, phase 29). The new claims' statements also skip the
	// probe for the ids that the EpochFilter (filter.go) says no older epoch holds
	// (c.maybe false), when the current epoch is still the one it was built under ($epoch,
	// $opened); a NULL maybe, epoch or opened (no filter) probes. Both gates are outside the
	// index scan: checked per id, they read nothing when they fail.
	knownOlder := func(scope, filtered string) string {
		return `
LEFT JOIN LATERAL (SELECT true AS known FROM ` + t + ` o
                   WHERE e.oldest < e.epoch` + filtered + ` AND o.scope = ` + scope + ` AND o.message_id = c.message_id AND o.epoch < e.epoch LIMIT 1) k ON true`
	}
	filtered := func(epoch, opened string) string {
		return ` AND (c.maybe IS NOT FALSE OR e.epoch IS DISTINCT FROM ` + epoch + `::int OR e.opened IS DISTINCT FROM ` + opened + `::timestamptz)`
	}
	// A stored row is claimable when its retention has passed, or when it is a reservation
	// whose lease has ended and the payload is the same.
	claimable := func(p, c string) string {
		return p + `.expires_at <= now() OR (` + p + `.status = 'in_flight' AND ` + p + `.lease_until <= now() AND ` + p + `.fingerprint = ` + c + `.fingerprint)`
	}
	return queries{
		// Taken before a claim, so that its statement's snapshot comes after it
		// (epochs.go); in READ COMMITTED only, where each statement takes its own
		// snapshot (a REPEATABLE READ transaction's would date from before the lock).
		// It also turns sequential and bitmap scans off for the claim's statements
		// (byindex.go).
		epochLock: `SELECT current_setting('transaction_isolation'), ` + scansOff + ` FROM pg_advisory_xact_lock_shared($1)`,

		// A new id. ON CONFLICT waits for a concurrent uncommitted claim of the same key to
		// finish: the id is claimed if that one rolled back. An id of an older epoch is
		// left to the lookup.
		claimNew: `
INSERT INTO ` + t + ` AS p (scope, message_id, fingerprint, status, received_at, completed_at,
                         expires_at, lease_until, lease_token, epoch)
SELECT c.scope, c.message_id, c.fingerprint, c.status, now(),
       CASE WHEN c.status = 'done' THEN now() END,
       now() + c.retain_us * interval '1 microsecond',
       CASE WHEN c.token IS NOT NULL THEN now() + c.lease_us * interval '1 microsecond' END,
       c.token, e.epoch
FROM ` + current + `
CROSS JOIN unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::bigint[], $6::bigint[], $7::uuid[], $8::bool[])
     AS c(scope, message_id, fingerprint, status, retain_us, lease_us, token, maybe)` + knownOlder("c.scope", filtered("$9", "$10")) + `
WHERE k.known IS NULL
ORDER BY c.scope, c.message_id
ON CONFLICT (scope, message_id, epoch) DO NOTHING
RETURNING p.scope, p.message_id`,

		// claimNew for claims that share their scope ($1) and retention ($4) and reserve
		// nothing, as a subscription's batch does: those go once, not once per row
		// (BENCHMARKS.md, phase 20). The same rows as claimNew writes for them.
		claimNewShared: `
INSERT INTO ` + t + ` AS p (scope, message_id, fingerprint, status, received_at, completed_at, expires_at, epoch)
SELECT $1::text, c.message_id, c.fingerprint, 'done', now(), now(), now() + $4::bigint * interval '1 microsecond', e.epoch
FROM ` + current + `
CROSS JOIN unnest($2::text[], $3::bytea[], $5::bool[]) AS c(message_id, fingerprint, maybe)` + knownOlder("$1::text", filtered("$6", "$7")) + `
WHERE k.known IS NULL
ORDER BY c.message_id
ON CONFLICT (scope, message_id, epoch) DO NOTHING
RETURNING p.scope, p.message_id`,

		// A known id that is claimable, checked again here under the row's lock against its
		// latest version. A row of the current epoch is updated in place; one of an older
		// epoch is moved to the current one (deleted there, inserted here), so that dropping
		// its old partition does not lose it. An older row that is not claimable (any more:
		// another claimer took it first) stays, and its id is not inserted. A row taken over
		// is a new message's: what was stored of the old one (its answer, its stale mark)
		// goes.
		claim: `
WITH e AS (SELECT max(epoch) AS epoch, min(epoch) AS oldest FROM ` + epochs + `),
c AS (SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::bigint[], $6::bigint[], $7::uuid[])
      AS c(scope, message_id, fingerprint, status, retain_us, lease_us, token)),
moved AS (
    DELETE FROM ` + t + ` o USING c, e
    WHERE o.scope = c.scope AND o.message_id = c.message_id AND o.epoch < e.epoch
      AND (` + claimable("o", "c") + `)
    RETURNING o.scope, o.message_id)
INSERT INTO ` + t + ` AS p (scope, message_id, fingerprint, status, received_at, completed_at,
                         expires_at, lease_until, lease_token, epoch)
SELECT c.scope, c.message_id, c.fingerprint, c.status, now(),
       CASE WHEN c.status = 'done' THEN now() END,
       now() + c.retain_us * interval '1 microsecond',
       CASE WHEN c.token IS NOT NULL THEN now() + c.lease_us * interval '1 microsecond' END,
       c.token, e.epoch
FROM c CROSS JOIN e` + knownOlder("c.scope", "") + `
WHERE k.known IS NULL OR EXISTS (SELECT 1 FROM moved m WHERE m.scope = c.scope AND m.message_id = c.message_id)
ORDER BY c.scope, c.message_id
ON CONFLICT (scope, message_id, epoch) DO UPDATE SET
    fingerprint = EXCLUDED.fingerprint, status = EXCLUDED.status,
    response_status = NULL, response_headers = NULL, response_body = NULL,
    stale_entity = NULL, stale_version = NULL,
    received_at = EXCLUDED.received_at, completed_at = EXCLUDED.completed_at,
    expires_at = EXCLUDED.expires_at, lease_until = EXCLUDED.lease_until,
    lease_token = EXCLUDED.lease_token
WHERE ` + claimable("p", "EXCLUDED") + `
RETURNING p.scope, p.message_id`,

		// The stored rows of ids that claimNew did not claim, and whether each may be
		// taken over (claim's condition). An id that the EpochFilter does not hold ($4
		// false, while the current epoch is the one it was built under, $5 and $6, as in
		// claimNew) is in no older epoch: only the current epoch's partition is read for
		// it, its lower bound on the epoch letting PostgreSQL prune the older partitions
		// for that id when it runs. A redelivered id, the common known id, had its
		// lookup read every older partition's primary key, pages that nothing else reads
		// and that the cache had lost on large tables (BENCHMARKS.md, phase 34). OFFSET 0
		// keeps the probe a subquery run per id: pulled up into the join, the bound became
		// a filter checked after every partition was read. The other bound, the least
		// integer, is every epoch.
		lookup: `
SELECT p.scope, p.message_id, p.fingerprint, p.status, p.response_status, p.response_headers,
       p.response_body, p.received_at, p.completed_at, p.expires_at, p.lease_until,
       ` + claimable("p", "c") + `
FROM ` + current + `
CROSS JOIN unnest($1::text[], $2::text[], $3::bytea[], $4::bool[]) AS c(scope, message_id, fingerprint, maybe)
JOIN LATERAL (SELECT * FROM ` + t + ` p
              WHERE p.scope = c.scope AND p.message_id = c.message_id
                AND p.epoch >= CASE WHEN c.maybe IS FALSE AND e.epoch IS NOT DISTINCT FROM $5::int
                                         AND e.opened IS NOT DISTINCT FROM $6::timestamptz
                                    THEN e.epoch ELSE -2147483648 END
              OFFSET 0) p ON true`,

		// The payload is kept from the first sighting (the same fingerprint means the same
		// payload); every sighting extends the row's life by the record's retention.
		conflict: `
INSERT INTO ` + schema + `.conflicts AS c (scope, message_id, stored_fingerprint, incoming_fingerprint,
                                       payload, payload_truncated, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, now() + $7::bigint * interval '1 microsecond')
ON CONFLICT (scope, message_id, incoming_fingerprint)
DO UPDATE SET count = c.count + 1, last_seen_at = now(), expires_at = EXCLUDED.expires_at,
    payload = coalesce(c.payload, EXCLUDED.payload),
    payload_truncated = CASE WHEN c.payload IS NULL THEN EXCLUDED.payload_truncated ELSE c.payload_truncated END
RETURNING c.count`,

		complete: `
UPDATE ` + t + ` AS p SET
    status = c.status, completed_at = now(), lease_until = NULL, lease_token = NULL,
    response_status = c.response_status, response_headers = c.response_headers::jsonb,
    response_body = c.response_body
FROM unnest($1::text[], $2::text[], $3::text[], $4::int[], $5::text[], $6::bytea[], $7::uuid[])
     AS c(scope, message_id, status, response_status, response_headers, response_body, token)
WHERE p.scope = c.scope AND p.message_id = c.message_id
  AND (c.token IS NULL OR p.lease_token = c.token)`,

		replayed: `UPDATE ` + t + ` SET status = 'done', completed_at = now() WHERE scope = $1 AND message_id = $2 AND status = 'dead'`,

		// Whatever the record's epoch: a replayed dead letter's may be an older one.
		stale: `UPDATE ` + t + ` SET stale_entity = $3, stale_version = $4::numeric WHERE scope = $1 AND message_id = $2`,

		acquire: `
SELECT pg_current_xact_id()::text FROM ` + t + `
WHERE scope = $1 AND message_id = $2 AND status = 'in_flight' AND lease_token = $3`,

		forget: `
DELETE FROM ` + t + ` p USING unnest($1::text[], $2::text[]) AS c(scope, message_id)
WHERE p.scope = c.scope AND p.message_id = c.message_id`,

		release: `DELETE FROM ` + t + ` WHERE scope = $1 AND message_id = $2 AND status = 'in_flight' AND lease_token = $3`,

		// Conflicts recorded before migration 0004 have no expires_at: they go after the
		// store's retention since they were last seen.
		pruneConflicts: `
DELETE FROM ` + schema + `.conflicts WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM ` + schema + `.conflicts
    WHERE expires_at IS NULL AND last_seen_at <= now() - $2::bigint * interval '1 microsecond'
    ORDER BY last_seen_at LIMIT $1
    FOR UPDATE SKIP LOCKED))`,

		pruneConflictsExpired: `
DELETE FROM ` + schema + `.conflicts WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM ` + schema + `.conflicts
    WHERE expires_at <= now()
    ORDER BY expires_at LIMIT $1
    FOR UPDATE SKIP LOCKED))`,
	}
}

// pruneSQL deletes at most $1 expired records of the partition part (quoted), in a batch by
// ctid, which names a row only within one partition: each statement deletes at most $1
// rows and holds its locks briefly. With $2, a span in microseconds, it deletes only the
// records the partition would otherwise keep more than that span past their expiry: those
// that expired before the partition's last expiry minus the span (PruneOutlived). With $2
// NULL, the bound is NULL and least() ignores it: every expired record goes.
func pruneSQL(part string) string {
	return `
DELETE FROM ` + part + ` WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM ` + part + `
    WHERE expires_at <= least(now(), (SELECT max(expires_at) FROM ` + part + `) - $2::bigint * interval '1 microsecond')
      AND (status <> 'in_flight' OR lease_until IS NULL OR lease_until <= now())
    ORDER BY expires_at LIMIT $1
    FOR UPDATE SKIP LOCKED))`
}

package processed

// queries are built once per Store, with the schema already quoted in.
type queries struct {
	claimNew, claimNewShared, claim, lookup, conflict, complete, replayed, acquire, release, forget, prune, pruneConflicts, pruneConflictsExpired string
}

func newQueries(schema string) queries {
	t := schema + ".processed_messages"
	return queries{
		// A new id. ON CONFLICT waits for a concurrent uncommitted claim of the same key to
		// finish: the id is claimed if that one rolled back.
		claimNew: `
INSERT INTO ` + t + ` AS p (scope, message_id, fingerprint, status, received_at, completed_at,
                         expires_at, lease_until, lease_token)
SELECT c.scope, c.message_id, c.fingerprint, c.status, now(),
       CASE WHEN c.status = 'done' THEN now() END,
       now() + c.retain_us * interval '1 microsecond',
       CASE WHEN c.token IS NOT NULL THEN now() + c.lease_us * interval '1 microsecond' END,
       c.token
FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::bigint[], $6::bigint[], $7::uuid[])
     AS c(scope, message_id, fingerprint, status, retain_us, lease_us, token)
ORDER BY c.scope, c.message_id
ON CONFLICT (scope, message_id) DO NOTHING
RETURNING p.scope, p.message_id`,

		// claimNew for claims that share their scope ($1) and retention ($4) and reserve
		// nothing, as a subscription's batch does: those go once, not once per row
		// (BENCHMARKS.md, phase 20). The same rows as claimNew writes for them.
		claimNewShared: `
INSERT INTO ` + t + ` AS p (scope, message_id, fingerprint, status, received_at, completed_at, expires_at)
SELECT $1::text, c.message_id, c.fingerprint, 'done', now(), now(), now() + $4::bigint * interval '1 microsecond'
FROM unnest($2::text[], $3::bytea[]) AS c(message_id, fingerprint)
ORDER BY c.message_id
ON CONFLICT (scope, message_id) DO NOTHING
RETURNING p.scope, p.message_id`,

		// A known id is claimable when its retention has passed, or when it is a
		// reservation whose lease has ended (and the payload is the same); the condition
		// is checked again here, under the row's lock, against its latest version.
		claim: `
INSERT INTO ` + t + ` AS p (scope, message_id, fingerprint, status, received_at, completed_at,
                         expires_at, lease_until, lease_token)
SELECT c.scope, c.message_id, c.fingerprint, c.status, now(),
       CASE WHEN c.status = 'done' THEN now() END,
       now() + c.retain_us * interval '1 microsecond',
       CASE WHEN c.token IS NOT NULL THEN now() + c.lease_us * interval '1 microsecond' END,
       c.token
FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::bigint[], $6::bigint[], $7::uuid[])
     AS c(scope, message_id, fingerprint, status, retain_us, lease_us, token)
ORDER BY c.scope, c.message_id
ON CONFLICT (scope, message_id) DO UPDATE SET
    fingerprint = EXCLUDED.fingerprint, status = EXCLUDED.status,
    response_status = NULL, response_headers = NULL, response_body = NULL,
    received_at = EXCLUDED.received_at, completed_at = EXCLUDED.completed_at,
    expires_at = EXCLUDED.expires_at, lease_until = EXCLUDED.lease_until,
    lease_token = EXCLUDED.lease_token
WHERE p.expires_at <= now()
   OR (p.status = 'in_flight' AND p.lease_until <= now() AND p.fingerprint = EXCLUDED.fingerprint)
RETURNING p.scope, p.message_id`,

		// The stored rows of ids that claimNew did not claim, and whether each may be
		// taken over (claim's condition).
		lookup: `
SELECT p.scope, p.message_id, p.fingerprint, p.status, p.response_status, p.response_headers,
       p.response_body, p.received_at, p.completed_at, p.expires_at, p.lease_until,
       p.expires_at <= now() OR (p.status = 'in_flight' AND p.lease_until <= now() AND p.fingerprint = c.fingerprint)
FROM unnest($1::text[], $2::text[], $3::bytea[]) AS c(scope, message_id, fingerprint)
JOIN ` + t + ` p ON p.scope = c.scope AND p.message_id = c.message_id`,

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

		acquire: `
SELECT pg_current_xact_id()::text FROM ` + t + `
WHERE scope = $1 AND message_id = $2 AND status = 'in_flight' AND lease_token = $3`,

		forget: `
DELETE FROM ` + t + ` p USING unnest($1::text[], $2::text[]) AS c(scope, message_id)
WHERE p.scope = c.scope AND p.message_id = c.message_id`,

		release: `DELETE FROM ` + t + ` WHERE scope = $1 AND message_id = $2 AND status = 'in_flight' AND lease_token = $3`,

		// ctid batches: each statement deletes at most $1 rows and holds its locks briefly.
		prune: `
DELETE FROM ` + t + ` WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM ` + t + `
    WHERE expires_at <= now() AND (status <> 'in_flight' OR lease_until IS NULL OR lease_until <= now())
    ORDER BY expires_at LIMIT $1
    FOR UPDATE SKIP LOCKED))`,

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

-- The operator console and admin API (docs/console.md). {{.schema}} is the quoted schema
-- name (IDEMD_DB_SCHEMA).

-- Conflicts keep the conflicting payload, bounded (the first 64 KiB, payload_truncated when
-- cut), and expire with the retention of the record they conflict with. Rows written before
-- this migration have no expires_at: the pruner keeps using last_seen_at for them.
ALTER TABLE {{.schema}}.conflicts
    ADD COLUMN payload           bytea,
    ADD COLUMN payload_truncated boolean NOT NULL DEFAULT false,
    ADD COLUMN expires_at        timestamptz;
CREATE INDEX conflicts_expires_at_idx ON {{.schema}}.conflicts (expires_at) WHERE expires_at IS NOT NULL;

-- Search: processed records by time range (newest first) and by message id across pipelines.
CREATE INDEX processed_messages_received_at_idx ON {{.schema}}.processed_messages (received_at);
CREATE INDEX processed_messages_message_id_idx ON {{.schema}}.processed_messages (message_id);

-- Dead letters by time range, and their retention (replayed ones first).
CREATE INDEX dead_letters_created_at_idx ON {{.schema}}.dead_letters (created_at);
CREATE INDEX dead_letters_replayed_at_idx ON {{.schema}}.dead_letters (replayed_at) WHERE replayed_at IS NOT NULL;

-- A message's story: its outbox rows and deliveries, by operation id or causation id.
CREATE INDEX outbox_operation_id_idx ON {{.schema}}.outbox (operation_id);
CREATE INDEX outbox_causation_id_idx ON {{.schema}}.outbox (causation_id);
CREATE INDEX http_deliveries_causation_id_idx ON {{.schema}}.http_deliveries (causation_id);

-- Retention of the stale-event guard's versions.
CREATE INDEX entity_versions_updated_at_idx ON {{.schema}}.entity_versions (updated_at);

-- Every write through the admin API or console: who (the admin token's name), when, what,
-- on which target, and the result. A bulk replay writes one row per letter, sharing its
-- request_id.
CREATE TABLE {{.schema}}.admin_audit (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    actor       text        NOT NULL,
    action      text        NOT NULL,
    target      text        NOT NULL,
    outcome     text        NOT NULL,
    detail      text,
    request_id  uuid
);
CREATE INDEX admin_audit_target_idx ON {{.schema}}.admin_audit (action, target);
CREATE INDEX admin_audit_at_idx ON {{.schema}}.admin_audit (at);

---- create above / drop below ----

DROP TABLE {{.schema}}.admin_audit;
DROP INDEX {{.schema}}.entity_versions_updated_at_idx;
DROP INDEX {{.schema}}.http_deliveries_causation_id_idx;
DROP INDEX {{.schema}}.outbox_causation_id_idx;
DROP INDEX {{.schema}}.outbox_operation_id_idx;
DROP INDEX {{.schema}}.dead_letters_replayed_at_idx;
DROP INDEX {{.schema}}.dead_letters_created_at_idx;
DROP INDEX {{.schema}}.processed_messages_message_id_idx;
DROP INDEX {{.schema}}.processed_messages_received_at_idx;
DROP INDEX {{.schema}}.conflicts_expires_at_idx;
ALTER TABLE {{.schema}}.conflicts DROP COLUMN expires_at, DROP COLUMN payload_truncated, DROP COLUMN payload;

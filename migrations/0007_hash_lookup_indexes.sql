-- The operators' lookups by message, operation and causation id (migration 0004 and, for
-- http_deliveries.operation_id, 0002) become hash indexes. {{.schema}} is the quoted schema
-- name.
--
-- These ids are random (event ids, UUIDs), so a B-tree takes each insert at a random leaf
-- and stores the whole key; a hash index stores a 4-byte hash per row. Measured here
-- (BENCHMARKS.md, phase 6): inserting 200,000 random 44-character ids cost PostgreSQL about
-- 5 µs more per row with a B-tree on them and 2 µs more with a hash index, and on 10 M rows
-- the hash index is half the B-tree's size (320 against 647 MB). Every query on these columns is an equality (the admin API's and
-- the console's filters), which is all a hash index answers. The primary keys, and the
-- indexes that order (received_at, expires_at, the relay's queue), stay B-trees.
--
-- Runs in one transaction, so each table's writes wait while its index is built: instant
-- on a new schema, seconds per million rows on a full one. To upgrade a large database
-- without that pause, build the new indexes beforehand with CREATE INDEX CONCURRENTLY
-- under the same names (docs/daemon.md, "Upgrading"): IF NOT EXISTS then keeps them.
CREATE INDEX IF NOT EXISTS processed_messages_message_id_hash_idx ON {{.schema}}.processed_messages USING hash (message_id);
DROP INDEX IF EXISTS {{.schema}}.processed_messages_message_id_idx;

CREATE INDEX IF NOT EXISTS outbox_operation_id_hash_idx ON {{.schema}}.outbox USING hash (operation_id);
DROP INDEX IF EXISTS {{.schema}}.outbox_operation_id_idx;
CREATE INDEX IF NOT EXISTS outbox_causation_id_hash_idx ON {{.schema}}.outbox USING hash (causation_id);
DROP INDEX IF EXISTS {{.schema}}.outbox_causation_id_idx;

CREATE INDEX IF NOT EXISTS http_deliveries_operation_id_hash_idx ON {{.schema}}.http_deliveries USING hash (operation_id);
DROP INDEX IF EXISTS {{.schema}}.http_deliveries_operation_id_idx;
CREATE INDEX IF NOT EXISTS http_deliveries_causation_id_hash_idx ON {{.schema}}.http_deliveries USING hash (causation_id);
DROP INDEX IF EXISTS {{.schema}}.http_deliveries_causation_id_idx;

---- create above / drop below ----

CREATE INDEX IF NOT EXISTS http_deliveries_causation_id_idx ON {{.schema}}.http_deliveries (causation_id);
DROP INDEX IF EXISTS {{.schema}}.http_deliveries_causation_id_hash_idx;
CREATE INDEX IF NOT EXISTS http_deliveries_operation_id_idx ON {{.schema}}.http_deliveries (operation_id);
DROP INDEX IF EXISTS {{.schema}}.http_deliveries_operation_id_hash_idx;

CREATE INDEX IF NOT EXISTS outbox_causation_id_idx ON {{.schema}}.outbox (causation_id);
DROP INDEX IF EXISTS {{.schema}}.outbox_causation_id_hash_idx;
CREATE INDEX IF NOT EXISTS outbox_operation_id_idx ON {{.schema}}.outbox (operation_id);
DROP INDEX IF EXISTS {{.schema}}.outbox_operation_id_hash_idx;

CREATE INDEX IF NOT EXISTS processed_messages_message_id_idx ON {{.schema}}.processed_messages (message_id);
DROP INDEX IF EXISTS {{.schema}}.processed_messages_message_id_hash_idx;

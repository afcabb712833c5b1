-- Fewer index entries written per message. {{.schema}} is the quoted schema name.
--
-- Every message the doors apply writes a processed_messages row and, for each event, an
-- outbox row; each index on them is one more random write per row (and, for the outbox,
-- one more dead entry to vacuum when the relay deletes the row). Three of those indexes
-- served only the console's and `idemd inspect`'s searches, and can be served otherwise:
--
-- processed_messages (message_id): a search by message id across scopes now walks the
-- primary key, one probe per distinct scope (processed.Store.ListRecords).
--
-- outbox (operation_id), (causation_id): by default the relay deletes a row once the broker
-- has it, so the outbox holds only the rows still to publish, which a search reads through
-- outbox_unpublished_idx; only published rows kept with IDEMD_OUTBOX_KEEP_PUBLISHED are
-- indexed by these ids. Marking a row published already writes a new entry in every index
-- (published_at is in their predicates), so a kept row costs no more than before.
--
-- idemd-bench, back to back (BENCHMARKS.md, phase 10): the limit's writes (the consumer's,
-- done as fast as pgx can) ran at 1.1–1.3 times their rate with the three indexes, and
-- PostgreSQL spent about a fifth less CPU per message for the consumer.
--
-- On a large outbox kept with IDEMD_OUTBOX_KEEP_PUBLISHED, building the two partial indexes
-- holds off writes to the outbox while it runs, as migration 0004's did.
DROP INDEX {{.schema}}.processed_messages_message_id_idx;
DROP INDEX {{.schema}}.outbox_operation_id_idx;
DROP INDEX {{.schema}}.outbox_causation_id_idx;
CREATE INDEX outbox_published_operation_id_idx ON {{.schema}}.outbox (operation_id) WHERE published_at IS NOT NULL;
CREATE INDEX outbox_published_causation_id_idx ON {{.schema}}.outbox (causation_id) WHERE published_at IS NOT NULL;

---- create above / drop below ----

DROP INDEX {{.schema}}.outbox_published_causation_id_idx;
DROP INDEX {{.schema}}.outbox_published_operation_id_idx;
CREATE INDEX outbox_causation_id_idx ON {{.schema}}.outbox (causation_id);
CREATE INDEX outbox_operation_id_idx ON {{.schema}}.outbox (operation_id);
CREATE INDEX processed_messages_message_id_idx ON {{.schema}}.processed_messages (message_id);

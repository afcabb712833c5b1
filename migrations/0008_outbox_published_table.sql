-- The outbox holds only the rows still to publish; published rows kept with
-- IDEMD_OUTBOX_KEEP_PUBLISHED move to a table of their own. {{.schema}} is the quoted
-- schema name.
--
-- By default the relay deletes a row once the broker has it, so every outbox row was
-- unpublished and the partial index outbox_unpublished_idx (id WHERE published_at IS NULL)
-- held the same entries as the primary key: one more index entry written, and one more
-- dead entry to vacuum, per event. idemd-bench counted it at 0.8 WAL records and 1.5
-- buffers per message (BENCHMARKS.md, phases 16 and 17). It was there for the rows kept
-- published, which the relay's reads had to step over; they now live in outbox_published,
-- the relay reads the outbox by its primary key, and the searches of kept rows by
-- operation id, causation id and age use outbox_published's own indexes.
--
-- outbox.published_at stays, always NULL, so that a replica of an earlier version still
-- running during the upgrade keeps working; rows such a replica marks published in the
-- outbox (with IDEMD_OUTBOX_KEEP_PUBLISHED) after this migration stay there until deleted
-- by hand. Moving the rows kept so far rewrites them once: on a large kept outbox this
-- migration takes a while and holds off writes to the outbox while it runs.
-- The outbox's columns, its row's id (not an identity: the outbox gave it) as the key.
CREATE TABLE {{.schema}}.outbox_published (LIKE {{.schema}}.outbox INCLUDING DEFAULTS);
ALTER TABLE {{.schema}}.outbox_published
    ADD PRIMARY KEY (id),
    ALTER COLUMN published_at SET NOT NULL,
    ALTER COLUMN published_at SET DEFAULT now();
INSERT INTO {{.schema}}.outbox_published (id, operation_id, pipeline, causation_id, topic, key, payload, headers, created_at, published_at)
SELECT id, operation_id, pipeline, causation_id, topic, key, payload, headers, created_at, published_at
FROM {{.schema}}.outbox WHERE published_at IS NOT NULL;
DELETE FROM {{.schema}}.outbox WHERE published_at IS NOT NULL;
DROP INDEX {{.schema}}.outbox_unpublished_idx;
DROP INDEX {{.schema}}.outbox_published_at_idx;
DROP INDEX {{.schema}}.outbox_published_operation_id_idx;
DROP INDEX {{.schema}}.outbox_published_causation_id_idx;
CREATE INDEX outbox_published_at_idx ON {{.schema}}.outbox_published (published_at);
CREATE INDEX outbox_published_operation_id_idx ON {{.schema}}.outbox_published (operation_id);
CREATE INDEX outbox_published_causation_id_idx ON {{.schema}}.outbox_published (causation_id);
-- The pruner deletes from it all day long, as from processed_messages (migration 0006).
ALTER TABLE {{.schema}}.outbox_published SET (autovacuum_vacuum_scale_factor = 0.02);

---- create above / drop below ----

INSERT INTO {{.schema}}.outbox (id, operation_id, pipeline, causation_id, topic, key, payload, headers, created_at, published_at)
OVERRIDING SYSTEM VALUE
SELECT id, operation_id, pipeline, causation_id, topic, key, payload, headers, created_at, published_at
FROM {{.schema}}.outbox_published;
DROP TABLE {{.schema}}.outbox_published;
CREATE INDEX outbox_unpublished_idx ON {{.schema}}.outbox (id) WHERE published_at IS NULL;
CREATE INDEX outbox_published_at_idx ON {{.schema}}.outbox (published_at) WHERE published_at IS NOT NULL;
CREATE INDEX outbox_published_operation_id_idx ON {{.schema}}.outbox (operation_id) WHERE published_at IS NOT NULL;
CREATE INDEX outbox_published_causation_id_idx ON {{.schema}}.outbox (causation_id) WHERE published_at IS NOT NULL;

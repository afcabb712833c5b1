-- processed_messages becomes a table partitioned by epoch, so that the pruner can drop a
-- whole partition of expired records instead of deleting them row by row.
-- {{.schema}} is the quoted schema name.
--
-- Why: the pruner's deletes leave dead rows that only VACUUM reclaims; on a busy server
-- VACUUM falls behind at times and the table and its indexes grow (idemd-bench's pruning
-- section, BENCHMARKS.md phases 7, 23 and 25). Dropping a partition whose every record has
-- expired frees its space at once and writes nothing per row.
--
-- How: an epoch is a span of time (IDEMD_PROCESSED_PARTITION_INTERVAL); each epoch's new
-- records go to its own partition, processed_messages_e<epoch>. processed_epochs lists the
-- live epochs; the highest is the current one, the one that claims insert into. PostgreSQL
-- keeps a unique key across partitions only when the key holds the partition key, so the
-- primary key is (scope, message_id, epoch), and a claim also checks the older epochs for
-- its id (processed/queries.go). A claim takes a shared advisory lock and the switch to a
-- new epoch takes it exclusively, so no claim can still be inserting into an epoch that a
-- later claim checks as closed (processed/epochs.go).
--
-- With IDEMD_PROCESSED_PARTITION_INTERVAL unset nothing changes: epoch 0 stays the only
-- one and the pruner deletes expired records as before.
--
-- The records kept so far become epoch 0's partition: the table is renamed, not copied,
-- but its primary key is rebuilt with the epoch in it, which on a large table takes a
-- while and holds off writes to processed_messages while it runs. A replica of an earlier
-- version still running during the upgrade fails its claims (their ON CONFLICT names the
-- old key) and acknowledges nothing; its messages are redelivered to upgraded replicas.
CREATE TABLE {{.schema}}.processed_epochs (
    epoch     integer     PRIMARY KEY,
    opened_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO {{.schema}}.processed_epochs (epoch) VALUES (0);

-- The current epoch: the default of processed_messages.epoch, for rows written by hand.
-- idemd's claims name the epoch themselves.
CREATE FUNCTION {{.schema}}.processed_epoch() RETURNS integer
    LANGUAGE sql STABLE
    RETURN (SELECT max(epoch) FROM {{.schema}}.processed_epochs);

ALTER TABLE {{.schema}}.processed_messages RENAME TO processed_messages_e0;
ALTER INDEX {{.schema}}.processed_messages_expires_at_idx RENAME TO processed_messages_e0_expires_at_idx;
ALTER INDEX {{.schema}}.processed_messages_received_at_idx RENAME TO processed_messages_e0_received_at_idx;
ALTER TABLE {{.schema}}.processed_messages_e0
    ADD COLUMN epoch integer NOT NULL DEFAULT 0,
    DROP CONSTRAINT processed_messages_pkey,
    ADD CONSTRAINT processed_messages_e0_pkey PRIMARY KEY (scope, message_id, epoch),
    ADD CONSTRAINT processed_messages_e0_epoch CHECK (epoch = 0);

CREATE TABLE {{.schema}}.processed_messages (
    scope            text        NOT NULL,
    message_id       text        NOT NULL,
    fingerprint      bytea       NOT NULL,
    status           text        NOT NULL
                                 CONSTRAINT processed_messages_status_check CHECK (status IN ('in_flight', 'done', 'dead')),
    response_status  integer,
    response_headers jsonb,
    response_body    bytea,
    received_at      timestamptz NOT NULL DEFAULT now(),
    completed_at     timestamptz,
    expires_at       timestamptz NOT NULL,
    lease_until      timestamptz,
    lease_token      uuid,
    epoch            integer     NOT NULL DEFAULT {{.schema}}.processed_epoch(),
    PRIMARY KEY (scope, message_id, epoch)
) PARTITION BY RANGE (epoch);
-- The pruner's deletes (epoch 0) and its check that a partition has expired.
CREATE INDEX processed_messages_expires_at_idx ON {{.schema}}.processed_messages (expires_at);
-- The console's listing by time (migration 0004).
CREATE INDEX processed_messages_received_at_idx ON {{.schema}}.processed_messages (received_at);
-- The CHECK above spares ATTACH its scan of the rows; the indexes are matched, not rebuilt.
ALTER TABLE {{.schema}}.processed_messages ATTACH PARTITION {{.schema}}.processed_messages_e0 FOR VALUES FROM (0) TO (1);
ALTER TABLE {{.schema}}.processed_messages_e0 ALTER COLUMN epoch DROP DEFAULT;

---- create above / drop below ----

-- Back to one table: every live epoch's records, in epoch 0's partition.
DELETE FROM {{.schema}}.processed_epochs WHERE epoch > 0;
ALTER TABLE {{.schema}}.processed_messages DETACH PARTITION {{.schema}}.processed_messages_e0;
INSERT INTO {{.schema}}.processed_messages_e0 (scope, message_id, fingerprint, status, response_status, response_headers,
    response_body, received_at, completed_at, expires_at, lease_until, lease_token, epoch)
SELECT scope, message_id, fingerprint, status, response_status, response_headers,
    response_body, received_at, completed_at, expires_at, lease_until, lease_token, 0
FROM {{.schema}}.processed_messages;
DROP TABLE {{.schema}}.processed_messages;
ALTER TABLE {{.schema}}.processed_messages_e0
    DROP CONSTRAINT processed_messages_e0_epoch,
    DROP CONSTRAINT processed_messages_e0_pkey,
    ADD CONSTRAINT processed_messages_pkey PRIMARY KEY (scope, message_id),
    DROP COLUMN epoch;
ALTER TABLE {{.schema}}.processed_messages_e0 RENAME TO processed_messages;
ALTER INDEX {{.schema}}.processed_messages_e0_expires_at_idx RENAME TO processed_messages_expires_at_idx;
ALTER INDEX {{.schema}}.processed_messages_e0_received_at_idx RENAME TO processed_messages_received_at_idx;
DROP FUNCTION {{.schema}}.processed_epoch();
DROP TABLE {{.schema}}.processed_epochs;

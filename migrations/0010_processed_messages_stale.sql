-- A record says when the stale-event guard (`order:`) skipped its message's effect.
-- {{.schema}} is the quoted schema name.
--
-- A stale message is recorded 'done', as an applied one is, so that a redelivery of it is a
-- duplicate and retention, pruning and epochs treat it alike; but the admin API then told it
-- apart from an applied one by nothing. stale_entity and stale_version are the entity and
-- the version (as the guard compares it: a number, a time in microseconds since the Unix
-- epoch) that the guard found not newer than the entity's last applied version. Both are
-- NULL for every other record, stale_version NOT NULL marks a stale one. Only the statement
-- that records a message as stale writes them, in its transaction (processed.Store.
-- QueueStale); nothing is added to the work of an applied message.
--
-- Columns without a default are added to the catalog only: on the partitioned table they
-- reach every epoch's partition, and no row is rewritten. The partitions opened later are
-- made LIKE processed_messages, with them. A replica of an earlier version still running
-- during the upgrade records its stale messages without them (they read as processed).
ALTER TABLE {{.schema}}.processed_messages
    ADD COLUMN stale_entity  text,
    ADD COLUMN stale_version numeric;

---- create above / drop below ----

ALTER TABLE {{.schema}}.processed_messages
    DROP COLUMN stale_version,
    DROP COLUMN stale_entity;

-- Vacuum the two tables that idemd deletes from all day long sooner than PostgreSQL's
-- default (after 20 % of a table's rows are dead). {{.schema}} is the quoted schema name.
--
-- processed_messages: the pruner deletes a day's records every day (a seventh of a 7-day
-- retention); with the default, a 10 M-row table is vacuumed after 2 M dead rows, so two
-- days of pruned records stay on disk and the rows inserted meanwhile cannot reuse their
-- space (idemd-bench, BENCHMARKS.md). At 2 % it is vacuumed after about a fifth of a day's.
--
-- outbox: the relay deletes each row once the broker has it (unless
-- IDEMD_OUTBOX_KEEP_PUBLISHED), so nearly every row the table held is dead, and each round
-- of the relay steps over the dead index entries at the head of the queue until a VACUUM
-- removes them. Its live rows are few, so the default already vacuums it at every
-- autovacuum round; with published rows kept, 2 % keeps that true.
ALTER TABLE {{.schema}}.processed_messages SET (autovacuum_vacuum_scale_factor = 0.02);
ALTER TABLE {{.schema}}.outbox SET (autovacuum_vacuum_scale_factor = 0.02);

---- create above / drop below ----

ALTER TABLE {{.schema}}.outbox RESET (autovacuum_vacuum_scale_factor);
ALTER TABLE {{.schema}}.processed_messages RESET (autovacuum_vacuum_scale_factor);

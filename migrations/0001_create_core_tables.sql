-- Core tables of idemd. {{.schema}} is the quoted schema name (IDEMD_DB_SCHEMA).

-- One row per (scope, message id) ever claimed and not yet pruned. The primary key is what
-- makes a claim atomic: a second INSERT of the same key blocks until the first transaction
-- ends, then sees its row.
CREATE TABLE {{.schema}}.processed_messages (
    scope            text        NOT NULL,
    message_id       text        NOT NULL,
    fingerprint      bytea       NOT NULL,
    status           text        NOT NULL CHECK (status IN ('in_flight', 'done', 'dead')),
    response_status  integer,
    response_headers jsonb,
    response_body    bytea,
    received_at      timestamptz NOT NULL DEFAULT now(),
    completed_at     timestamptz,
    expires_at       timestamptz NOT NULL,
    lease_until      timestamptz,
    lease_token      uuid,
    PRIMARY KEY (scope, message_id)
);
-- The pruner deletes expired rows in bounded batches, oldest first.
CREATE INDEX processed_messages_expires_at_idx ON {{.schema}}.processed_messages (expires_at);

-- Same id, different fingerprint: one row per distinct incoming fingerprint, counted.
CREATE TABLE {{.schema}}.conflicts (
    scope                text        NOT NULL,
    message_id           text        NOT NULL,
    stored_fingerprint   bytea       NOT NULL,
    incoming_fingerprint bytea       NOT NULL,
    first_seen_at        timestamptz NOT NULL DEFAULT now(),
    last_seen_at         timestamptz NOT NULL DEFAULT now(),
    count                bigint      NOT NULL DEFAULT 1,
    PRIMARY KEY (scope, message_id, incoming_fingerprint)
);
CREATE INDEX conflicts_last_seen_at_idx ON {{.schema}}.conflicts (last_seen_at);

-- Transactional outbox. Rows are published in id order; the relay never keeps a cursor, it
-- selects every unpublished row, so a transaction that commits late is never skipped.
CREATE TABLE {{.schema}}.outbox (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    operation_id  uuid        NOT NULL,
    pipeline      text        NOT NULL,
    causation_id  text        NOT NULL,
    topic         text        NOT NULL,
    key           bytea,
    payload       bytea       NOT NULL,
    headers       jsonb       NOT NULL DEFAULT '{}',
    created_at    timestamptz NOT NULL DEFAULT now(),
    published_at  timestamptz
);
CREATE INDEX outbox_unpublished_idx ON {{.schema}}.outbox (id) WHERE published_at IS NULL;
CREATE INDEX outbox_published_at_idx ON {{.schema}}.outbox (published_at) WHERE published_at IS NOT NULL;

-- Messages whose effect failed permanently, kept whole so that they can be replayed.
CREATE TABLE {{.schema}}.dead_letters (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    pipeline     text        NOT NULL,
    scope        text        NOT NULL,
    message_id   text,
    payload      bytea       NOT NULL,
    headers      jsonb       NOT NULL DEFAULT '{}',
    metadata     jsonb       NOT NULL DEFAULT '{}',
    reason       text        NOT NULL,
    attempts     integer     NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    replayed_at  timestamptz
);
CREATE INDEX dead_letters_pipeline_id_idx ON {{.schema}}.dead_letters (pipeline, id);
CREATE INDEX dead_letters_scope_message_id_idx ON {{.schema}}.dead_letters (scope, message_id);

-- Last applied version per entity, for the stale-event guard of subscriptions.
CREATE TABLE {{.schema}}.entity_versions (
    scope       text        NOT NULL,
    entity      text        NOT NULL,
    version     numeric     NOT NULL,
    message_id  text        NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, entity)
);

---- create above / drop below ----

DROP TABLE {{.schema}}.entity_versions;
DROP TABLE {{.schema}}.dead_letters;
DROP TABLE {{.schema}}.outbox;
DROP TABLE {{.schema}}.conflicts;
DROP TABLE {{.schema}}.processed_messages;

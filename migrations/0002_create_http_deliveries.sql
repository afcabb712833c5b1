-- Outbound HTTP delivery of outbox events (publish: {http: …}). {{.schema}} is the quoted
-- schema name (IDEMD_DB_SCHEMA). All delivery state lives here, so that a restart loses
-- nothing: attempts, the next attempt time, the last error, the outcome.

-- One row per (event, endpoint), written by outbox.EnqueueTx in the effect transaction.
-- A row is 'pending' until it is 'delivered' (2xx) or 'dead' (dead-lettered). Deliverers
-- claim pending rows with FOR UPDATE SKIP LOCKED and hold them with a lease while the
-- request is in flight; a row whose deliverer died becomes claimable when its lease ends.
CREATE TABLE {{.schema}}.http_deliveries (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    endpoint        text        NOT NULL,
    operation_id    uuid        NOT NULL,
    pipeline        text        NOT NULL,
    causation_id    text        NOT NULL,
    key             bytea,
    payload         bytea       NOT NULL,
    headers         jsonb       NOT NULL DEFAULT '{}',
    state           text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'dead')),
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    lease_until     timestamptz,
    lease_token     uuid,
    last_status     integer,
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz
);
-- Claims scan an endpoint's pending rows in id order.
CREATE INDEX http_deliveries_pending_idx ON {{.schema}}.http_deliveries (endpoint, id) WHERE state = 'pending';
-- Per-key ordering: a row is claimable only when no earlier pending row has its key.
CREATE INDEX http_deliveries_pending_key_idx ON {{.schema}}.http_deliveries (endpoint, key, id) WHERE state = 'pending' AND key IS NOT NULL;
-- The deliverer sleeps until the next retry is due.
CREATE INDEX http_deliveries_next_attempt_idx ON {{.schema}}.http_deliveries (endpoint, next_attempt_at) WHERE state = 'pending';
-- Finished rows are pruned oldest first.
CREATE INDEX http_deliveries_finished_at_idx ON {{.schema}}.http_deliveries (finished_at) WHERE state <> 'pending';
-- Operators look a delivery up by its operation id (the Idempotency-Key the endpoint saw).
CREATE INDEX http_deliveries_operation_id_idx ON {{.schema}}.http_deliveries (operation_id);

-- Endpoint state that must survive restarts. An endpoint that answered 410 Gone is disabled:
-- its pending rows stay queued until an operator re-enables it
-- (UPDATE … SET disabled_at = NULL, or delivery.Enable).
CREATE TABLE {{.schema}}.http_endpoints (
    name            text        PRIMARY KEY,
    url             text        NOT NULL,
    disabled_at     timestamptz,
    disabled_reason text,
    updated_at      timestamptz NOT NULL DEFAULT now()
);

---- create above / drop below ----

DROP TABLE {{.schema}}.http_endpoints;
DROP TABLE {{.schema}}.http_deliveries;

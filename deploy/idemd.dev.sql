-- Effect tables of deploy/idemd.dev.yaml. `idemd dev` runs this in the schema
-- {IDEMD_DB_SCHEMA}_dev (idemd_dev by default), which it puts first on the search_path.
CREATE TABLE IF NOT EXISTS payments (
    event_id    text        PRIMARY KEY,
    payment_id  text,
    amount      bigint,
    received_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS orders (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant     text        NOT NULL,
    body       jsonb       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS ledger (
    event_id   text        PRIMARY KEY,
    payment_id text,
    body       jsonb       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS gcp_payments (
    operation_id text        PRIMARY KEY,
    payment_id   text,
    body         jsonb       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS aws_payments (
    operation_id text        PRIMARY KEY,
    payment_id   text,
    body         jsonb       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- A dead letter's origin becomes typed: which door wrote it (and so how it is replayed), and
-- the outbox row, HTTP delivery and operation id it stands for. Until now this lived in
-- metadata and in prefixes of scope; existing letters are classified from those.
ALTER TABLE {{.schema}}.dead_letters
    ADD COLUMN door         text,
    ADD COLUMN outbox_id    bigint,
    ADD COLUMN delivery_id  bigint,
    ADD COLUMN operation_id uuid;

UPDATE {{.schema}}.dead_letters SET
    door = CASE
        WHEN metadata->>'door' = 'http_delivery' THEN 'delivery'
        WHEN metadata->>'door' = 'relay' THEN 'relay'
        WHEN metadata->>'door' = 'http' THEN 'http'
        WHEN metadata ? 'partition' THEN 'kafka'
        ELSE 'http'
    END,
    outbox_id = CASE WHEN jsonb_typeof(metadata->'outbox_id') = 'number' THEN (metadata->>'outbox_id')::bigint END,
    delivery_id = CASE WHEN jsonb_typeof(metadata->'delivery_id') = 'number' THEN (metadata->>'delivery_id')::bigint END,
    operation_id = CASE
        WHEN metadata->>'operation_id' ~ '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$'
        THEN (metadata->>'operation_id')::uuid
    END;

ALTER TABLE {{.schema}}.dead_letters
    ALTER COLUMN door SET NOT NULL,
    ADD CONSTRAINT dead_letters_door_check CHECK (door <> '');

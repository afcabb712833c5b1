-- Per-endpoint delivery state of publish targets (issue 17): the circuit breaker and the
-- rate budget of each HTTP endpoint live beside its disabled state, so that every deliverer
-- shares them and a restart keeps them. {{.schema}} is the quoted schema name.
--
-- breaker_failures counts consecutive failed attempts; breaker_open_until is set while the
-- breaker is open (NULL: closed); breaker_probe_until leases the one probe of a half-open
-- breaker to the deliverer that sent it. rate_tokens and rate_at are the token bucket of
-- the endpoint's rate (NULL: full).
ALTER TABLE {{.schema}}.http_endpoints
    ADD COLUMN breaker_failures    integer NOT NULL DEFAULT 0,
    ADD COLUMN breaker_open_until  timestamptz,
    ADD COLUMN breaker_probe_until timestamptz,
    ADD COLUMN rate_tokens         double precision,
    ADD COLUMN rate_at             timestamptz;

---- create above / drop below ----

ALTER TABLE {{.schema}}.http_endpoints
    DROP COLUMN rate_at,
    DROP COLUMN rate_tokens,
    DROP COLUMN breaker_probe_until,
    DROP COLUMN breaker_open_until,
    DROP COLUMN breaker_failures;

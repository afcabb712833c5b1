// The client against the real daemon: idemd built from this repository, serving an API
// source with the Idempotency-Key contract on PostgreSQL. The effect inserts one row per
// applied request, so "one effect" is a count in the database.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, describe, it } from "node:test";

import { ConflictError, IdempotentClient, PROBLEM_TYPE_CONFLICT, type Retry } from "@idemd/client";
import { type Idemd, lockTable, psql, schemaName, startIdemd, startProxy } from "./idemd.js";

describe("against idemd", { timeout: 60_000 }, () => {
  const schema = schemaName("ts_client");
  let idemd: Idemd | undefined;

  before(async () => {
    await psql(`CREATE SCHEMA ${schema};
      CREATE TABLE ${schema}.orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, tenant text, key text, body jsonb)`);
    idemd = await startIdemd(
      schema,
      `sources:
  - name: orders
    path: /v1/orders
    verify: {scheme: bearer, tokens_env: TS_ORDERS_TOKENS}
    idempotency: {required: true}
    effect:
      sql: "INSERT INTO ${schema}.orders (tenant, key, body) VALUES (@tenant, @key, @payload) RETURNING id, tenant, key"
      status: 201
`,
      { TS_ORDERS_TOKENS: "token-a=acme" },
    );
  });

  after(async () => {
    await idemd?.stop();
    await psql(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
  });

  const order = (body: object): RequestInit => ({
    method: "POST",
    headers: { Authorization: "Bearer token-a", "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  const effects = (key: string) => psql(`SELECT count(*) FROM ${schema}.orders WHERE key = '${key.replace(/'/g, "''")}' AND tenant = 'acme'`);

  it("retries an answer lost after the commit with the same key, and gets the stored answer, replayed, with one effect", async () => {
    const proxy = await startProxy(idemd!.url, (n) => n === 1);
    try {
      const retries: Retry[] = [];
      const client = new IdempotentClient({ backoffMin: 1, backoffMax: 5, onRetry: (r) => retries.push(r) });
      const res = await client.fetch(`${proxy.url}/v1/orders`, order({ sku: "book", qty: 1 }));
      const body = await res.response.text();

      assert.equal(res.response.status, 201, body);
      assert.equal(res.replayed, true);
      assert.equal(res.attempts, 2);
      assert.equal(retries.length, 1);
      assert.equal(retries[0].status, 0, "the first attempt got no answer");
      assert.ok(retries[0].error instanceof TypeError, String(retries[0].error));

      const [lost, replayed] = proxy.forwarded;
      assert.equal(proxy.forwarded.length, 2);
      assert.deepEqual([lost.lost, lost.status, lost.headers["idempotent-replayed"]], [true, 201, undefined], "idemd committed and answered the first attempt");
      assert.equal(replayed.headers["idempotent-replayed"], "true");
      assert.equal(body, lost.body, "the stored answer, byte for byte");

      assert.equal(await effects(res.key), "1", "one effect");
      const id = await psql(`SELECT id FROM ${schema}.orders WHERE key = '${res.key}'`);
      const got: unknown = JSON.parse(body);
      const row = (Array.isArray(got) ? got[0] : got) as { id: number; key: string };
      assert.equal(String(row.id), id, "the original result");
      assert.equal(row.key, res.key, "idemd read the Structured Fields string as the bare key");
    } finally {
      await proxy.close();
    }
  });

  it("two concurrent calls with one key: one effect; the other gets 409, then the replay", async () => {
    const key = `concurrent-${randomUUID()}`;
    // The first call to reserve the key blocks in its effect until the other got its 409.
    const lock = await lockTable(`${schema}.orders`);
    let released: Promise<void> | undefined;
    const retries: Retry[] = [];
    const client = new IdempotentClient({
      onRetry: (r) => {
        retries.push(r);
        if (r.status === 409) released ??= lock.release();
      },
    });
    const call = async () => {
      const res = await client.fetch(`${idemd!.url}/v1/orders`, order({ sku: "pen", qty: 3 }), { key });
      return { ...res, body: await res.response.text() };
    };
    let results;
    try {
      results = await Promise.all([call(), call()]);
    } finally {
      released ??= lock.release();
      await released;
    }

    const [first, second] = results.sort((a, b) => a.attempts - b.attempts);
    assert.deepEqual([first.response.status, first.replayed, first.attempts], [201, false, 1]);
    assert.deepEqual([second.response.status, second.replayed, second.attempts], [201, true, 2]);
    assert.deepEqual(
      retries.map((r) => r.status),
      [409],
    );
    assert.ok(retries[0].wait >= 1_000, "idemd's Retry-After: 1 honoured");
    assert.equal(second.body, first.body);
    assert.equal(await effects(key), "1", "one effect");
  });

  it("a changed body with the same key raises the conflict error, and runs no effect", async () => {
    const key = `conflict-${randomUUID()}`;
    const client = new IdempotentClient();
    const first = await client.fetch(`${idemd!.url}/v1/orders`, order({ sku: "book", qty: 1 }), { key });
    const firstBody = await first.response.text();
    assert.equal(first.response.status, 201);

    const err = await client.fetch(`${idemd!.url}/v1/orders`, order({ sku: "book", qty: 2 }), { key }).catch((e: unknown) => e);
    assert.ok(err instanceof ConflictError, String(err));
    assert.equal(err.status, 422);
    assert.equal(err.attempts, 1, "never retried");
    assert.equal(err.key, key);
    assert.equal(err.replayed, false);
    assert.equal(err.problem.type, PROBLEM_TYPE_CONFLICT);
    assert.equal(err.problem.status, 422);
    assert.equal(err.problem.retryable, false);
    assert.equal(err.problem.message_id, key);
    assert.equal(await effects(key), "1");

    // The original request again is still answered with its stored result.
    const again = await client.fetch(`${idemd!.url}/v1/orders`, order({ sku: "book", qty: 1 }), { key });
    assert.equal(again.replayed, true);
    assert.equal(await again.response.text(), firstBody);
  });
});

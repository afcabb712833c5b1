// Unit tests of what the case table does not cover: Retry-After parsing, keys, Prefer,
// bodies, cancellation, the deadline, the attempt timeout and the options.
import assert from "node:assert/strict";
import { createServer } from "node:net";
import type { AddressInfo } from "node:net";
import { describe, it } from "node:test";

import {
  ConflictError,
  IdempotentClient,
  NetworkError,
  ProblemError,
  idempotentFetch,
  parseRetryAfter,
  type Retry,
} from "@idemd/client";
import { type Answer, FakeClock, scriptedFetch } from "./fakes.js";

const url = "https://api.example.test/v1/orders";
const post = (body: BodyInit = '{"sku":"book"}'): RequestInit => ({ method: "POST", headers: { "Content-Type": "application/json" }, body });

/** A client on a fake clock with a scripted fetch and tiny backoffs. */
function setup(answers: Answer[], options: ConstructorParameters<typeof IdempotentClient>[0] = {}) {
  const clock = new FakeClock();
  const { fetch, seen } = scriptedFetch(answers, clock);
  const retries: Retry[] = [];
  const client = new IdempotentClient({ fetch, clock, backoffMin: 10, backoffMax: 40, onRetry: (r) => retries.push(r), ...options });
  return { clock, client, seen, retries };
}

describe("parseRetryAfter", () => {
  const now = Date.UTC(2026, 0, 2, 3, 4, 5);
  const cases: [string | null, number | undefined][] = [
    [null, undefined],
    ["", undefined],
    ["3", 3000],
    [" 0 ", 0],
    ["+3", 3000],
    ["-1", undefined],
    ["1.5", undefined],
    ["soon", undefined],
    ["99999999999999", 100 * 365 * 24 * 3600 * 1000], // cut to 100 years, as in Go
    ["99999999999999999999", undefined], // beyond int64: malformed, as in Go
    ["Fri, 02 Jan 2026 03:05:35 GMT", 90_000], // IMF-fixdate
    ["Friday, 02-Jan-26 03:05:35 GMT", 90_000], // RFC 850
    ["Fri Jan  2 03:05:35 2026", 90_000], // asctime
    ["Thu, 01 Jan 2026 03:04:05 GMT", 0], // in the past
    ["Fri, 02 Jan 2026 03:05:35 CET", undefined],
    ["Tue, 31 Feb 2026 00:00:00 GMT", undefined],
    ["Fri, 02 Jan 2026 24:00:00 GMT", undefined],
    ["2026-01-02T03:05:35Z", undefined], // not an HTTP date, though Date.parse reads it
  ];
  for (const [value, want] of cases) {
    it(JSON.stringify(value), () => assert.equal(parseRetryAfter(value, now), want));
  }

  it("is honoured as an HTTP date by the client", async () => {
    const { clock, client, retries, seen } = setup([{ status: 503, retry_after: "Fri, 02 Jan 2026 03:04:50 GMT" }, { status: 201 }]);
    const res = await clock.run(client.fetch(url, post()));
    assert.equal(res.response.status, 201);
    assert.equal(retries[0].wait, 45_000);
    assert.equal(seen[1].time - seen[0].time, 45_000);
  });
});

describe("keys", () => {
  it("sends a caller's key as a Structured Fields string, escapes included", async () => {
    const { clock, client, seen } = setup([{ status: 503 }, { status: 201 }]);
    const res = await clock.run(client.fetch(url, post(), { key: 'order "7" \\ A' }));
    assert.equal(res.key, 'order "7" \\ A');
    assert.deepEqual(
      seen.map((s) => s.keyHeader),
      ['"order \\"7\\" \\\\ A"', '"order \\"7\\" \\\\ A"'],
    );
  });

  for (const header of ["pending-op-42", '"pending-op-42"', ' "pending-op-42";p=1 ']) {
    it(`reuses the request's Idempotency-Key header ${JSON.stringify(header)}`, async () => {
      const { clock, client, seen } = setup([{ status: 429 }, { status: 201 }]);
      const init = post();
      init.headers = { "Content-Type": "application/json", "Idempotency-Key": header };
      const res = await clock.run(client.fetch(url, init));
      assert.equal(res.key, "pending-op-42");
      assert.deepEqual(
        seen.map((s) => s.keyHeader),
        ['"pending-op-42"', '"pending-op-42"'],
      );
    });
  }

  it("generates a new key per operation, not per client", async () => {
    const { clock, client } = setup([{ status: 201 }, { status: 201 }]);
    const a = await clock.run(client.fetch(url, post()));
    const b = await clock.run(client.fetch(url, post()));
    assert.notEqual(a.key, b.key);
  });

  const bad: [string, RequestInit, { key?: string }, RegExp][] = [
    ["an empty key", post(), { key: "" }, /1 to 255 printable ASCII/],
    ["a key of 256 characters", post(), { key: "k".repeat(256) }, /1 to 255 printable ASCII/],
    ["a key that is not ASCII", post(), { key: "clé" }, /1 to 255 printable ASCII/],
    ["two keys in the header", { ...post(), headers: { "Idempotency-Key": '"a", "b"' } }, {}, /more than one/],
    ["a header and an option that differ", { ...post(), headers: { "Idempotency-Key": "a" } }, { key: "b" }, /differ/],
  ];
  for (const [name, init, call, message] of bad) {
    it(`refuses ${name} before sending anything`, async () => {
      const { client, seen } = setup([{ status: 201 }]);
      await assert.rejects(client.fetch(url, init, call), (e: unknown) => e instanceof TypeError && message.test(e.message));
      assert.equal(seen.length, 0);
    });
  }
});

describe("requests", () => {
  it("sends Prefer: wait=N when asked", async () => {
    const { clock, client, seen } = setup([{ status: 201 }], { preferWait: 5 });
    await clock.run(client.fetch(url, post()));
    assert.equal(seen[0].prefer, "wait=5");
    const other = setup([{ status: 201 }]);
    await other.clock.run(other.client.fetch(url, post(), { preferWait: 2 }));
    assert.equal(other.seen[0].prefer, "wait=2");
    const none = setup([{ status: 201 }]);
    await none.clock.run(none.client.fetch(url, post()));
    assert.equal(none.seen[0].prefer, null);
  });

  it("sends a FormData body with one boundary on every attempt", async () => {
    const { clock, client, seen } = setup([{ network: true }, { status: 201 }]);
    const form = new FormData();
    form.append("sku", "book");
    await clock.run(client.fetch(url, { method: "POST", body: form }));
    assert.equal(seen.length, 2);
    assert.match(seen[0].contentType ?? "", /^multipart\/form-data; boundary=/);
    assert.equal(seen[1].contentType, seen[0].contentType);
    assert.equal(seen[1].body, seen[0].body);
  });

  it("reads a stream body once and replays its bytes", async () => {
    const { clock, client, seen } = setup([{ status: 502 }, { status: 201 }]);
    const stream = new ReadableStream<Uint8Array>({
      start(c) {
        c.enqueue(new TextEncoder().encode('{"sku":'));
        c.enqueue(new TextEncoder().encode('"book"}'));
        c.close();
      },
    });
    await clock.run(client.fetch(url, { method: "POST", body: stream, duplex: "half" } as RequestInit));
    assert.deepEqual(
      seen.map((s) => s.body),
      ['{"sku":"book"}', '{"sku":"book"}'],
    );
  });

  it("releases the body of every retried answer", async () => {
    const clock = new FakeClock();
    let cancelled = 0;
    const body = () => new ReadableStream({ cancel: () => void cancelled++ });
    const answers = [new Response(body(), { status: 503 }), new Response(body(), { status: 429 }), new Response("{}", { status: 201 })];
    const client = new IdempotentClient({ clock, backoffMin: 1, backoffMax: 1, fetch: async () => answers.shift()! });
    await clock.run(client.fetch(url, post()));
    assert.equal(cancelled, 2);
  });

  it("keeps a final error's body and makes up a problem when the answer has none", async () => {
    const { clock, client } = setup([{ status: 402, body: '{"declined":true}', replayed: true }]);
    const err = await clock.run(client.fetch(url, post())).catch((e: unknown) => e);
    assert.ok(err instanceof ProblemError && !(err instanceof ConflictError));
    assert.equal(err.status, 402);
    assert.equal(err.body, '{"declined":true}');
    assert.equal(err.replayed, true);
    assert.deepEqual(err.problem, { type: "about:blank", title: "HTTP 402", status: 402 });
  });

  it("does not retry a certificate the runtime refuses", async () => {
    const clock = new FakeClock();
    let calls = 0;
    const client = new IdempotentClient({
      clock,
      fetch: async () => {
        calls++;
        const cause = Object.assign(new Error("self-signed certificate"), { code: "DEPTH_ZERO_SELF_SIGNED_CERT" });
        throw new TypeError("fetch failed", { cause });
      },
    });
    const err = await clock.run(client.fetch(url, post())).catch((e: unknown) => e);
    assert.ok(err instanceof NetworkError);
    assert.match(err.message, /attempt 1 of 6: fetch failed \(self-signed certificate\)/);
    assert.equal(calls, 1);
  });
});

describe("network errors that no retry can mend", () => {
  // The runtime's own fetch, on the real clock with tiny backoffs: these URLs never leave
  // the process, so they cost no network and no time.
  const attempts = async (target: string) => {
    let calls = 0;
    const client = new IdempotentClient({
      backoffMin: 1,
      backoffMax: 2,
      maxAttempts: 3,
      fetch: (request) => {
        calls++;
        return globalThis.fetch(request);
      },
    });
    const err = await client.fetch(target, post()).catch((e: unknown) => e);
    assert.ok(err instanceof NetworkError, String(err));
    return { calls, err };
  };

  for (const target of ["htp://127.0.0.1:8080/x", "ftp://127.0.0.1/x", "http://127.0.0.1:1/x", "https://127.0.0.1:25/x"]) {
    it(`fails at once for ${target}`, async () => {
      const { calls, err } = await attempts(target);
      assert.equal(calls, 1);
      assert.match(err.message, /attempt 1 of 3/);
    });
  }

  it("retries a refused connection", async () => {
    const server = createServer();
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const { port } = server.address() as AddressInfo;
    await new Promise<void>((resolve) => server.close(() => resolve()));
    const { calls, err } = await attempts(`http://127.0.0.1:${port}/x`);
    assert.equal(calls, 3);
    assert.match(err.message, /attempt 3 of 3/);
  });
});

describe("cancellation and deadlines", () => {
  it("stops during a wait when the signal aborts, with the signal's reason", async () => {
    const ctl = new AbortController();
    const { clock, client, seen } = setup([{ status: 503, retry_after: "30" }], { onRetry: () => ctl.abort() });
    const err = await clock.run(client.fetch(url, post(), { signal: ctl.signal })).catch((e: unknown) => e);
    assert.ok(err instanceof DOMException && err.name === "AbortError", String(err));
    assert.equal(seen.length, 1);
    assert.equal(clock.pending, 0);
  });

  it("stops an attempt in progress when the signal aborts", async () => {
    const ctl = new AbortController();
    const reason = new Error("the user left the page");
    const clock = new FakeClock();
    const { fetch, seen } = scriptedFetch([{ hang: true }], clock);
    const client = new IdempotentClient({
      clock,
      fetch: (req) => {
        queueMicrotask(() => ctl.abort(reason));
        return fetch(req);
      },
    });
    const err = await clock.run(client.fetch(url, post(), { signal: ctl.signal })).catch((e: unknown) => e);
    assert.equal(err, reason);
    assert.equal(seen.length, 1);
    assert.ok(seen[0].signal.aborted, "the attempt's request was aborted");
  });

  it("takes the signal from init as fetch does, and sends nothing when it has already aborted", async () => {
    const { clock, client, seen } = setup([{ status: 201 }]);
    const err = await clock.run(client.fetch(url, { ...post(), signal: AbortSignal.abort() })).catch((e: unknown) => e);
    assert.ok(err instanceof DOMException && err.name === "AbortError");
    assert.equal(seen.length, 0);
  });

  it("ends at the deadline while waiting for a Retry-After", async () => {
    const { clock, client, seen } = setup([{ status: 503, retry_after: "30" }], { timeout: 1_000 });
    const start = clock.now();
    const err = await clock.run(client.fetch(url, post())).catch((e: unknown) => e);
    assert.ok(err instanceof DOMException && err.name === "TimeoutError", String(err));
    assert.equal(clock.now() - start, 1_000);
    assert.equal(seen.length, 1);
  });

  it("caps an attempt that hangs at the deadline", async () => {
    const { clock, client, seen } = setup([{ hang: true }]);
    const start = clock.now();
    const err = await clock.run(client.fetch(url, post(), { timeout: 500 })).catch((e: unknown) => e);
    assert.ok(err instanceof DOMException && err.name === "TimeoutError", String(err));
    assert.equal(clock.now() - start, 500);
    assert.ok(seen[0].signal.aborted);
    assert.equal(clock.pending, 0);
  });

  it("retries an attempt that overran attemptTimeout, with the same key", async () => {
    const { clock, client, seen, retries } = setup([{ hang: true }, { status: 201, replayed: true }], { attemptTimeout: 2_000 });
    const res = await clock.run(client.fetch(url, post()));
    assert.equal(res.response.status, 201);
    assert.equal(res.replayed, true);
    assert.equal(res.attempts, 2);
    assert.equal(seen[1].time - seen[0].time, 2_000 + retries[0].wait);
    assert.ok(retries[0].error instanceof DOMException && retries[0].error.name === "TimeoutError");
    assert.equal(seen[1].keyHeader, seen[0].keyHeader);
    assert.equal(clock.pending, 0);
  });
});

describe("options", () => {
  const bad: [string, ConstructorParameters<typeof IdempotentClient>[0], RegExp][] = [
    ["maxAttempts 0", { maxAttempts: 0 }, /maxAttempts/],
    ["maxAttempts 1.5", { maxAttempts: 1.5 }, /maxAttempts/],
    ["backoffMax below backoffMin", { backoffMin: 100, backoffMax: 10 }, /backoffMax \(10 ms\) is below backoffMin \(100 ms\)/],
    ["a negative backoffMin", { backoffMin: -1 }, /backoffMin/],
    ["a negative retryAfterMax", { retryAfterMax: -1 }, /retryAfterMax/],
    ["a NaN timeout", { timeout: Number.NaN }, /timeout/],
    ["preferWait 0", { preferWait: 0 }, /preferWait/],
  ];
  for (const [name, options, message] of bad) {
    it(`refuses ${name}, naming the option`, () => {
      assert.throws(() => new IdempotentClient(options), (e: unknown) => e instanceof RangeError && message.test(e.message));
    });
  }

  it("idempotentFetch takes client and call options in one object", async () => {
    const clock = new FakeClock();
    const { fetch, seen } = scriptedFetch([{ status: 409, retry_after: "1" }, { status: 201, replayed: true }], clock);
    const res = await clock.run(idempotentFetch(url, post(), { fetch, clock, key: "intent-1", preferWait: 3 }));
    assert.deepEqual([res.key, res.replayed, res.attempts], ["intent-1", true, 2]);
    assert.equal(seen[1].time - seen[0].time, 1_000);
    assert.equal(seen[0].prefer, "wait=3");
  });
});

describe("package", () => {
  it("has no runtime dependencies and exports its typings", async () => {
    const { readFile, access } = await import("node:fs/promises");
    const pkg = JSON.parse(await readFile(new URL("../package.json", import.meta.url), "utf8")) as {
      dependencies?: object;
      exports: { ".": { types: string; default: string } };
    };
    assert.equal(pkg.dependencies, undefined);
    await access(new URL(`../${pkg.exports["."].types}`, import.meta.url));
    await access(new URL(`../${pkg.exports["."].default}`, import.meta.url));
  });
});

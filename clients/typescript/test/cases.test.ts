// The shared case table (idemclient/testdata/cases.json), replayed against this client with
// a scripted fetch and a fake clock. The Go client's TestSharedCases replays the same file.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, it } from "node:test";

import {
  BACKOFF_MAX_DEFAULT,
  BACKOFF_MIN_DEFAULT,
  ConflictError,
  IdempotentClient,
  MAX_ATTEMPTS_DEFAULT,
  NetworkError,
  ProblemError,
  RETRY_AFTER_MAX_DEFAULT,
  type IdempotentResponse,
  type Retry,
} from "@idemd/client";
import { type Answer, FakeClock, scriptedFetch } from "./fakes.js";

interface CaseConfig {
  max_attempts: number;
  backoff_min_ms: number;
  backoff_max_ms: number;
  retry_after_max_ms: number;
}

interface Case {
  name: string;
  answers: Answer[];
  attempts: number;
  waits_ms: [number, number][];
  outcome: { status?: number; replayed?: boolean; conflict?: boolean; error?: string };
}

// The table lives beside the Go client; this file runs from clients/typescript/build.
const table = JSON.parse(readFileSync(new URL("../../../idemclient/testdata/cases.json", import.meta.url), "utf8")) as {
  defaults: CaseConfig;
  config: CaseConfig;
  cases: Case[];
};

// The two ends of the jitter: Math.random returns [0, 1).
const jitterEnds = [
  { name: "least jitter", random: () => 0, end: 0 },
  { name: "most jitter", random: () => 1 - Number.EPSILON, end: 1 },
] as const;

describe("shared case table", () => {
  it("has cases and the Go client's defaults", () => {
    assert.ok(table.cases.length > 10);
    assert.deepEqual(table.defaults, {
      max_attempts: MAX_ATTEMPTS_DEFAULT,
      backoff_min_ms: BACKOFF_MIN_DEFAULT,
      backoff_max_ms: BACKOFF_MAX_DEFAULT,
      retry_after_max_ms: RETRY_AFTER_MAX_DEFAULT,
    });
  });

  for (const tc of table.cases) {
    for (const jitter of jitterEnds) {
      it(`${tc.name} (${jitter.name})`, async () => {
        const clock = new FakeClock();
        const { fetch, seen } = scriptedFetch(tc.answers, clock);
        const retries: Retry[] = [];
        const client = new IdempotentClient({
          fetch,
          clock,
          random: jitter.random,
          maxAttempts: table.config.max_attempts,
          backoffMin: table.config.backoff_min_ms,
          backoffMax: table.config.backoff_max_ms,
          retryAfterMax: table.config.retry_after_max_ms,
          onRetry: (r) => retries.push(r),
        });
        const op = client.fetch("https://api.example.test/v1/orders", {
          method: "POST",
          headers: { "Content-Type": "application/json" },
          body: '{"sku":"book"}',
        });
        let result: IdempotentResponse | undefined;
        let error: unknown;
        try {
          result = await clock.run(op);
        } catch (e) {
          error = e;
        }

        // Outcome.
        if (tc.outcome.error === "network") {
          assert.ok(error instanceof NetworkError, `want a NetworkError, got ${String(error)}`);
          assert.equal(error.attempts, tc.attempts);
        } else if (tc.outcome.status! < 400) {
          assert.ifError(error);
          assert.equal(result!.response.status, tc.outcome.status);
          assert.equal(result!.replayed, tc.outcome.replayed ?? false);
          assert.equal(result!.attempts, tc.attempts);
        } else {
          assert.ok(error instanceof ProblemError, `want a ProblemError, got ${String(error)}`);
          assert.equal(error instanceof ConflictError, tc.outcome.conflict ?? false, "ConflictError");
          assert.equal(error.status, tc.outcome.status);
          assert.equal(error.replayed, tc.outcome.replayed ?? false);
          assert.equal(error.attempts, tc.attempts);
          const last = tc.answers[tc.answers.length - 1];
          if (last.problem !== undefined) assert.deepEqual(error.problem, last.problem);
          else assert.equal(error.problem.type, "about:blank");
        }

        // Attempts: one key, sent as a Structured Fields string, and one body on every one.
        assert.equal(seen.length, tc.attempts, "attempts");
        const key = result?.key ?? (error as { key: string }).key;
        assert.match(key, /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
        for (const s of seen) {
          assert.equal(s.keyHeader, `"${key}"`);
          assert.equal(s.body, '{"sku":"book"}');
        }

        // Waits: reported, and really waited on the clock between attempts.
        assert.equal(retries.length, tc.waits_ms.length, "waits");
        retries.forEach((r, i) => {
          assert.equal(r.attempt, i + 1);
          assert.equal(r.key, key);
          assert.equal(r.status, tc.answers[i].status ?? 0, `status of attempt ${i + 1}`);
          assert.equal(r.error !== undefined, tc.answers[i].network ?? false, `error of attempt ${i + 1}`);
          assert.equal(r.wait, tc.waits_ms[i][jitter.end], `wait after attempt ${i + 1}`);
          assert.equal(seen[i + 1].time - seen[i].time, r.wait, `time between attempts ${i + 1} and ${i + 2}`);
        });
        assert.equal(clock.pending, 0, "no timer left behind");
      });
    }
  }
});

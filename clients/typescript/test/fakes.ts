// Test doubles for the unit tests: a clock whose time moves only when the code under test
// has nothing left to do but wait, and a fetch that answers from a script.
import type { Clock } from "@idemd/client";

interface Timer {
  at: number;
  seq: number;
  resolve: () => void;
}

/** Lets every pending promise callback and immediate run: the code under test is idle after. */
async function idle(): Promise<void> {
  for (let i = 0; i < 3; i++) await new Promise<void>((resolve) => setImmediate(resolve));
}

/**
 * A clock for tests. sleep() registers a timer; run() drives a promise to its end, moving
 * time to the earliest timer each time the code under test is idle, so a 30 s Retry-After
 * costs nothing and every wait is exact.
 */
export class FakeClock implements Clock {
  #now: number;
  #seq = 0;
  #timers: Timer[] = [];

  constructor(start = Date.UTC(2026, 0, 2, 3, 4, 5)) {
    this.#now = start;
  }

  now(): number {
    return this.#now;
  }

  /** The timers still waiting (0 once an operation ended and released its timers). */
  get pending(): number {
    return this.#timers.length;
  }

  sleep(ms: number, signal?: AbortSignal): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      if (signal?.aborted) {
        reject(signal.reason);
        return;
      }
      const timer: Timer = { at: this.#now + Math.max(0, ms), seq: this.#seq++, resolve: () => {} };
      const onAbort = () => {
        this.#timers = this.#timers.filter((t) => t !== timer);
        reject(signal?.reason);
      };
      timer.resolve = () => {
        signal?.removeEventListener("abort", onAbort);
        resolve();
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      this.#timers.push(timer);
    });
  }

  /** Drives p to its end; throws if p waits for something that is not time. */
  async run<T>(p: Promise<T>): Promise<T> {
    let settled = false;
    p.then(
      () => (settled = true),
      () => (settled = true),
    );
    for (;;) {
      await idle();
      if (settled) return p;
      if (this.#timers.length === 0) throw new Error("FakeClock.run: the operation waits for something other than time");
      this.#timers.sort((a, b) => a.at - b.at || a.seq - b.seq);
      const next = this.#timers.shift()!;
      this.#now = next.at;
      next.resolve();
    }
  }
}

/** One scripted answer: a lost connection, or a status with optional headers and body. */
export interface Answer {
  network?: boolean;
  status?: number;
  retry_after?: string;
  replayed?: boolean;
  problem?: Record<string, unknown>;
  body?: string;
  /** Never answer: wait until the attempt's signal aborts. */
  hang?: boolean;
}

/** What the fake server saw of one attempt. */
export interface Seen {
  time: number;
  keyHeader: string | null;
  prefer: string | null;
  contentType: string | null;
  body: string;
  signal: AbortSignal;
}

/**
 * A fetch that answers attempt n with answers[n-1] (418 beyond the script) and records what
 * each attempt carried and when (on clock).
 */
export function scriptedFetch(answers: Answer[], clock: Clock): { fetch: (req: Request) => Promise<Response>; seen: Seen[] } {
  const seen: Seen[] = [];
  const fetch = async (req: Request): Promise<Response> => {
    const body = await req.text();
    seen.push({
      time: clock.now(),
      keyHeader: req.headers.get("Idempotency-Key"),
      prefer: req.headers.get("Prefer"),
      contentType: req.headers.get("Content-Type"),
      body,
      signal: req.signal,
    });
    const a = answers[seen.length - 1];
    if (a === undefined) return new Response("attempt beyond the script", { status: 418 });
    if (a.hang) {
      return new Promise<Response>((_, reject) => {
        if (req.signal.aborted) reject(req.signal.reason);
        req.signal.addEventListener("abort", () => reject(req.signal.reason), { once: true });
      });
    }
    if (a.network) throw new TypeError("fetch failed", { cause: new Error("other side closed") });
    return answerResponse(a);
  };
  return { fetch, seen };
}

/** The Response of a scripted answer. */
export function answerResponse(a: Answer): Response {
  const headers = new Headers();
  if (a.retry_after !== undefined) headers.set("Retry-After", a.retry_after);
  if (a.replayed) headers.set("Idempotent-Replayed", "true");
  let body = a.body ?? "";
  if (a.problem !== undefined) {
    headers.set("Content-Type", "application/problem+json");
    body = JSON.stringify(a.problem);
  }
  return new Response(body, { status: a.status, headers });
}

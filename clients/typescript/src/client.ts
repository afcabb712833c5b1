import { type Clock, realClock } from "./clock.js";
import { ConflictError, NetworkError, ProblemError, isConflict, isReplayed } from "./errors.js";
import { HEADER_IDEMPOTENCY_KEY, newKey, parseKeyHeader, serializeKey, validKey, KEY_MAX_LENGTH } from "./key.js";
import { backoff, parseRetryAfter, retryableError, retryableStatus, unreachableURL } from "./retry.js";

/** The defaults of ClientOptions, the same as the Go client's (idemclient). */
export const MAX_ATTEMPTS_DEFAULT = 6;
export const BACKOFF_MIN_DEFAULT = 200;
export const BACKOFF_MAX_DEFAULT = 10_000;
export const RETRY_AFTER_MAX_DEFAULT = 60_000;

/** A failed attempt that will be retried, as `onRetry` sees it. */
export interface Retry {
  /** The idempotency key, the same on every attempt. */
  key: string;
  /** The number of the failed attempt, from 1. */
  attempt: number;
  /** The answer's status, 0 when there was none (`error` says why). */
  status: number;
  /** The error of fetch when no answer came. */
  error?: unknown;
  /** How long the client waits before the next attempt, in ms. */
  wait: number;
}

/** Options of an IdempotentClient: how every operation it sends is retried. */
export interface ClientOptions {
  /** Sends each attempt. Defaults to the global `fetch`. */
  fetch?: (request: Request) => Promise<Response>;
  /** Bounds the attempts of one operation, the first included. Defaults to 6. */
  maxAttempts?: number;
  /**
   * Bound the wait between attempts, in ms: full jitter over
   * min(backoffMax, backoffMin·2^(attempt-1)). Default to 200 ms and 10 s.
   */
  backoffMin?: number;
  backoffMax?: number;
  /**
   * The longest Retry-After (ms) the client waits for; a longer one ends the retries with
   * that answer. Defaults to 60 s.
   */
  retryAfterMax?: number;
  /**
   * The overall deadline of one operation in ms: it caps every attempt and every wait, up to
   * the final answer's headers (reading the body of a success is bounded by the signal
   * only), and an operation still running then rejects with a `TimeoutError` DOMException.
   * Defaults to none (the signal and maxAttempts bound the operation).
   */
  timeout?: number;
  /**
   * Bounds each attempt in ms, up to the answer's headers; an attempt that overruns counts
   * as a network error and is retried. Defaults to none.
   */
  attemptTimeout?: number;
  /**
   * Sends `Prefer: wait=N` (seconds): idemd then waits up to N s for a request with the
   * same key still in flight instead of answering 409 at once. Defaults to none.
   */
  preferWait?: number;
  /** Called before each wait between attempts (logs, metrics, tests). */
  onRetry?: (retry: Retry) => void;
  /** The clock of waits and deadlines. Defaults to the real clock; tests pass a fake one. */
  clock?: Clock;
  /** Draws the backoff jitter, a number in [0, 1). Defaults to Math.random. */
  random?: () => number;
}

/** Options of one operation. */
export interface CallOptions {
  /**
   * The idempotency key (1 to 255 printable ASCII characters). Defaults to the request's
   * Idempotency-Key header when it has one, else a new `crypto.randomUUID()`. Pass a key you
   * stored with the operation when it must survive a restart or a page reload.
   */
  key?: string;
  /** Cancels the operation: the attempt in progress and the waits. */
  signal?: AbortSignal;
  /** Overrides ClientOptions.timeout for this operation. */
  timeout?: number;
  /** Overrides ClientOptions.preferWait for this operation. */
  preferWait?: number;
}

/** Options of idempotentFetch: those of the client and of the call. */
export type IdempotentFetchOptions = ClientOptions & CallOptions;

/** The answer of an operation whose final status is below 400. */
export interface IdempotentResponse {
  /** The final answer; its body is not read yet. */
  response: Response;
  /** The idempotency key the operation was sent with. */
  key: string;
  /**
   * The server answered with the stored result of an earlier attempt or call
   * (`Idempotent-Replayed: true`) instead of applying the operation again.
   */
  replayed: boolean;
  /** How many attempts were sent. */
  attempts: number;
}

interface Settings {
  fetch: (request: Request) => Promise<Response>;
  maxAttempts: number;
  backoffMin: number;
  backoffMax: number;
  retryAfterMax: number;
  timeout?: number;
  attemptTimeout?: number;
  preferWait?: number;
  onRetry?: (retry: Retry) => void;
  clock: Clock;
  random: () => number;
}

/**
 * Sends requests with an idempotency key and retries them safely: one operation is sent
 * with one key, chosen before the first attempt and repeated unchanged on every retry, so
 * however many attempts reach the server it applies the operation at most once, and a retry
 * after a lost answer returns the original result. Reuse one client for many operations.
 */
export class IdempotentClient {
  readonly #s: Settings;

  /** Throws a RangeError naming the option that is out of range. */
  constructor(options: ClientOptions = {}) {
    const s: Settings = {
      fetch: options.fetch ?? ((request) => globalThis.fetch(request)),
      maxAttempts: options.maxAttempts ?? MAX_ATTEMPTS_DEFAULT,
      backoffMin: options.backoffMin ?? BACKOFF_MIN_DEFAULT,
      backoffMax: options.backoffMax ?? BACKOFF_MAX_DEFAULT,
      retryAfterMax: options.retryAfterMax ?? RETRY_AFTER_MAX_DEFAULT,
      timeout: options.timeout,
      attemptTimeout: options.attemptTimeout,
      preferWait: options.preferWait,
      onRetry: options.onRetry,
      clock: options.clock ?? realClock,
      random: options.random ?? Math.random,
    };
    if (!Number.isInteger(s.maxAttempts) || s.maxAttempts < 1) {
      throw new RangeError(`IdempotentClient: maxAttempts must be a positive integer, got ${s.maxAttempts}`);
    }
    if (!(s.backoffMin >= 0)) throw new RangeError(`IdempotentClient: backoffMin must be at least 0 ms, got ${s.backoffMin}`);
    if (!(s.backoffMax >= s.backoffMin)) {
      throw new RangeError(`IdempotentClient: backoffMax (${s.backoffMax} ms) is below backoffMin (${s.backoffMin} ms)`);
    }
    if (!(s.retryAfterMax >= 0)) throw new RangeError(`IdempotentClient: retryAfterMax must be at least 0 ms, got ${s.retryAfterMax}`);
    checkDuration("timeout", s.timeout);
    checkDuration("attemptTimeout", s.attemptTimeout);
    checkPreferWait(s.preferWait);
    this.#s = s;
  }

  /**
   * Sends the request `fetch(input, init)` would send, with an idempotency key, until the
   * server gives a final answer.
   *
   * Resolves with the first answer it does not retry when its status is below 400. Rejects
   * with a ConflictError (idemd's 422 #conflict: the key was used with another request), a
   * ProblemError (another final error status, any other 422 included, or the last answer
   * when the attempts ran out), a NetworkError (no answer came), the signal's reason when
   * `signal` aborted, or a `TimeoutError` DOMException when the deadline passed. Retried:
   * network errors, 408, 409 (in flight), 425, 429 and 5xx, after max(full-jitter backoff,
   * Retry-After); not a network error that no retry can mend (a certificate the runtime
   * refuses, a scheme other than http(s), a port the Fetch standard blocks).
   *
   * The body is read once before the first attempt and the same bytes are sent on every
   * attempt, so a FormData or stream body keeps one encoding (and one fingerprint).
   */
  async fetch(input: string | URL | Request, init: RequestInit = {}, call: CallOptions = {}): Promise<IdempotentResponse> {
    const s = this.#s;
    const timeout = call.timeout ?? s.timeout;
    const preferWait = call.preferWait ?? s.preferWait;
    checkDuration("timeout", timeout);
    checkPreferWait(preferWait);
    const signal = call.signal ?? init.signal ?? (input instanceof Request ? input.signal : undefined);

    // The request without its signal, built once: the method, the headers (the content type
    // of a FormData body included) and the body bytes of every attempt.
    const template = new Request(input, { ...init, signal: null });
    const key = operationKey(call.key, template.headers.get(HEADER_IDEMPOTENCY_KEY));
    const headers = new Headers(template.headers);
    headers.set(HEADER_IDEMPOTENCY_KEY, serializeKey(key));
    if (preferWait !== undefined) headers.append("Prefer", `wait=${preferWait}`);
    const body = template.body === null ? null : new Uint8Array(await template.arrayBuffer());
    const what = `${template.method} ${template.url} with key ${key}`;

    // done ends the timers of this operation when it returns.
    const done = new AbortController();
    const deadline = new AbortController();
    if (timeout !== undefined) {
      s.clock.sleep(timeout, done.signal).then(
        () => deadline.abort(new DOMException(`idempotentFetch: ${what} did not finish within its deadline of ${timeout} ms`, "TimeoutError")),
        () => {},
      );
    }
    const op = anySignal(signal === undefined || signal === null ? [deadline.signal] : [signal, deadline.signal]);
    try {
      if (op.aborted) throw op.reason;
      for (let attempt = 1; ; attempt++) {
        let response: Response | undefined;
        let error: unknown;
        try {
          response = await this.#attempt(template, { headers, body }, op);
        } catch (e) {
          error = e;
        }
        if (op.aborted) {
          await discard(response);
          throw op.reason;
        }
        const retry: Retry = { key, attempt, status: 0, wait: 0 };
        let retryAfter = 0;
        if (response === undefined) {
          retry.error = error;
          if (!retryableError(error) || unreachableURL(template.url) || attempt >= s.maxAttempts) {
            throw new NetworkError(`idempotentFetch: ${what}, attempt ${attempt} of ${s.maxAttempts}: ${describe(error)}`, key, attempt, { cause: error });
          }
        } else {
          retry.status = response.status;
          if (!retryableStatus(response.status) || attempt >= s.maxAttempts) {
            return await this.#finish(response, key, attempt, what, op);
          }
          const ra = parseRetryAfter(response.headers.get("Retry-After"), s.clock.now());
          if (ra !== undefined && ra > s.retryAfterMax) {
            return await this.#finish(response, key, attempt, what, op);
          }
          retryAfter = ra ?? 0;
          await discard(response);
        }
        retry.wait = Math.max(backoff(s.backoffMin, s.backoffMax, attempt, s.random), retryAfter);
        s.onRetry?.(retry);
        await s.clock.sleep(retry.wait, op);
      }
    } finally {
      done.abort();
    }
  }

  /** Sends one attempt under the operation's signal and the attempt timeout. */
  async #attempt(template: Request, init: RequestInit, op: AbortSignal): Promise<Response> {
    const s = this.#s;
    if (s.attemptTimeout === undefined) return s.fetch(new Request(template, { ...init, signal: op }));
    const timeout = s.attemptTimeout;
    const timedOut = new AbortController();
    const ended = new AbortController();
    s.clock.sleep(timeout, ended.signal).then(
      () => timedOut.abort(new DOMException(`the attempt got no answer within ${timeout} ms`, "TimeoutError")),
      () => {},
    );
    try {
      return await s.fetch(new Request(template, { ...init, signal: anySignal([op, timedOut.signal]) }));
    } finally {
      ended.abort();
    }
  }

  /** Returns a final answer below 400, or reads a final error answer and throws it. */
  async #finish(response: Response, key: string, attempts: number, what: string, op: AbortSignal): Promise<IdempotentResponse> {
    if (response.status < 400) return { response, key, replayed: isReplayed(response), attempts };
    let body = "";
    try {
      body = await response.text();
    } catch {
      if (op.aborted) throw op.reason;
    }
    const init = { key, attempts, response, body };
    const message = `idempotentFetch: ${what}, attempt ${attempts}: ${response.status} ${response.statusText}`.trimEnd();
    const err = new ProblemError(message, init);
    if (isConflict(response, err.problem)) {
      throw new ConflictError(`${message}: the key was already used with a different request`, init);
    }
    throw err;
  }
}

/**
 * Sends `fetch(input, init)` with an idempotency key and retries it safely; see
 * IdempotentClient.fetch. A shorthand for `new IdempotentClient(options).fetch(input, init, options)`.
 *
 * ```ts
 * const { response, replayed } = await idempotentFetch("https://api.example.com/v1/orders", {
 *   method: "POST",
 *   headers: { "Content-Type": "application/json", Authorization: `Bearer ${token}` },
 *   body: JSON.stringify({ sku: "book", qty: 1 }),
 * });
 * ```
 */
export function idempotentFetch(input: string | URL | Request, init?: RequestInit, options: IdempotentFetchOptions = {}): Promise<IdempotentResponse> {
  return new IdempotentClient(options).fetch(input, init, options);
}

/** The key of an operation: the caller's, else the request's header, else a new one. */
function operationKey(given: string | undefined, header: string | null): string {
  const fromHeader = header === null ? undefined : parseKeyHeader(header);
  if (given === undefined) return fromHeader ?? newKey();
  if (!validKey(given)) {
    throw new TypeError(`idempotentFetch: a key must be 1 to ${KEY_MAX_LENGTH} printable ASCII characters, got ${JSON.stringify(given)}`);
  }
  if (fromHeader !== undefined && fromHeader !== given) {
    throw new TypeError(`idempotentFetch: options.key ${JSON.stringify(given)} and the Idempotency-Key header ${JSON.stringify(fromHeader)} differ`);
  }
  return given;
}

function checkDuration(name: string, ms: number | undefined): void {
  if (ms !== undefined && !(ms >= 0)) throw new RangeError(`IdempotentClient: ${name} must be at least 0 ms, got ${ms}`);
}

function checkPreferWait(secs: number | undefined): void {
  if (secs !== undefined && !(Number.isInteger(secs) && secs >= 1)) {
    throw new RangeError(`IdempotentClient: preferWait must be a whole number of seconds, at least 1, got ${secs}`);
  }
}

/**
 * A signal that aborts with the reason of the first of signals to abort. AbortSignal.any
 * where the runtime has it (its listeners do not pile up on a long-lived signal), else by
 * hand.
 */
function anySignal(signals: AbortSignal[]): AbortSignal {
  const any = (AbortSignal as { any?: (signals: AbortSignal[]) => AbortSignal }).any;
  if (typeof any === "function") return any.call(AbortSignal, signals);
  const c = new AbortController();
  for (const s of signals) {
    if (s.aborted) {
      c.abort(s.reason);
      break;
    }
    s.addEventListener("abort", () => c.abort(s.reason), { once: true, signal: c.signal });
  }
  return c.signal;
}

/** Lets a retried answer go without reading it, so that its connection is released. */
async function discard(response: Response | undefined): Promise<void> {
  try {
    await response?.body?.cancel();
  } catch {
    // Nothing to release.
  }
}

/** The message of a fetch error with its cause (undici puts the reason there). */
function describe(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  const cause = error.cause instanceof Error ? error.cause.message : undefined;
  return cause && cause !== error.message ? `${error.message} (${cause})` : error.message;
}

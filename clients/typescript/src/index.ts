/**
 * @idemd/client calls HTTP APIs that honour the Idempotency-Key contract (idemd's API
 * sources, or any API following the IETF draft) so that retries are safe. Guarantee: one
 * operation is sent with one key, chosen once before the first attempt and repeated
 * unchanged on every retry, so however many attempts reach the server it applies the
 * operation at most once, and a retry after a lost answer returns the original result.
 * The twin of idemd's Go client (idemclient): both replay one table of cases in their tests.
 *
 * @module
 */
export {
  IdempotentClient,
  idempotentFetch,
  MAX_ATTEMPTS_DEFAULT,
  BACKOFF_MIN_DEFAULT,
  BACKOFF_MAX_DEFAULT,
  RETRY_AFTER_MAX_DEFAULT,
  type CallOptions,
  type ClientOptions,
  type IdempotentFetchOptions,
  type IdempotentResponse,
  type Retry,
} from "./client.js";
export { type Clock, realClock } from "./clock.js";
export {
  ConflictError,
  IdempotencyError,
  NetworkError,
  ProblemError,
  PROBLEM_TYPE_CONFLICT,
  PROBLEM_TYPE_EFFECT_FAILED,
  type ProblemDetails,
} from "./errors.js";
export { HEADER_IDEMPOTENCY_KEY, KEY_MAX_LENGTH, newKey } from "./key.js";
export { parseRetryAfter } from "./retry.js";

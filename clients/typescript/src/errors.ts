/**
 * An RFC 9457 problem detail, as idemd (and many APIs) answer errors with
 * `Content-Type: application/problem+json`. idemd's `type` is stable (clients branch on it)
 * and `retryable` says whether the same request may succeed later.
 */
export interface ProblemDetails {
  type: string;
  title?: string;
  status?: number;
  detail?: string;
  instance?: string;
  /** idemd: whether the same request may succeed later. */
  retryable?: boolean;
  /** idemd: the message id (the idempotency key) the problem is about. */
  message_id?: string;
  [extension: string]: unknown;
}

/** The problem type idemd gives a 422 whose request reused a key with another request. */
export const PROBLEM_TYPE_CONFLICT = "https://github.com/idemd/idemd/blob/main/docs/receiver.md#conflict";
/** The problem type of the stored 422 of an operation whose effect failed permanently. */
export const PROBLEM_TYPE_EFFECT_FAILED = "https://github.com/idemd/idemd/blob/main/docs/receiver.md#effect-failed";

/** What every error of the client knows about the operation. */
export class IdempotencyError extends Error {
  override name = "IdempotencyError";
  /** The idempotency key the operation was sent with, the same on every attempt. */
  readonly key: string;
  /** How many attempts were sent. */
  readonly attempts: number;

  constructor(message: string, key: string, attempts: number, options?: { cause?: unknown }) {
    super(message, options);
    this.key = key;
    this.attempts = attempts;
  }
}

/** The fields of a ProblemError besides its message. */
export interface ProblemErrorInit {
  key: string;
  attempts: number;
  response: Response;
  body: string;
}

/**
 * The final answer was an error (status 400 or above) that the client does not retry: any
 * 4xx but 408, 409, 425 and 429, or the last answer when the attempts ran out, or one whose
 * Retry-After was longer than `retryAfterMax`.
 */
export class ProblemError extends IdempotencyError {
  override name = "ProblemError";
  /** The answer's HTTP status. */
  readonly status: number;
  /**
   * The answer's problem details: its body when it is `application/problem+json`, else
   * `{type: "about:blank", title: <status text>, status}` (RFC 9457 §4.2.1).
   */
  readonly problem: ProblemDetails;
  /** The answer's body as text (already read; `response.body` is used). */
  readonly body: string;
  /** The answer, for its headers. */
  readonly response: Response;
  /**
   * The answer is the stored result of an earlier attempt (`Idempotent-Replayed: true`): the
   * operation ended with this error once and for all, like a card declined with 402.
   */
  readonly replayed: boolean;

  constructor(message: string, init: ProblemErrorInit) {
    super(message, init.key, init.attempts);
    this.response = init.response;
    this.status = init.response.status;
    this.body = init.body;
    this.replayed = isReplayed(init.response);
    this.problem = problemOf(init.response, init.body);
  }
}

/**
 * 422 of problem type PROBLEM_TYPE_CONFLICT: idemd says the key was already used with a
 * different request (another body, method or path). The operation's effect did not run for
 * this request. Never retried: it is a bug in the caller (a key reused for a new intent) or
 * a changed request sent with an old key. Any other 422 (a business error, idemd's 422 of a
 * failed effect, another API's validation error), first answer or replay, is the
 * operation's own result: a plain ProblemError.
 */
export class ConflictError extends ProblemError {
  override name = "ConflictError";
}

/**
 * No answer came: the last attempt failed on the network (connection refused or lost,
 * attempt timeout) and the attempts ran out, or the failure cannot get better (a
 * certificate the runtime refuses). `cause` is the last error of fetch. The operation may or
 * may not have been applied: send it again later with the same `key` to find out.
 */
export class NetworkError extends IdempotencyError {
  override name = "NetworkError";
}

/** Reports whether the answer carries `Idempotent-Replayed: true` (or the Structured Fields `?1`). */
export function isReplayed(response: Response): boolean {
  const v = response.headers.get("Idempotent-Replayed")?.trim().toLowerCase();
  return v === "true" || v === "?1";
}

/**
 * Reports whether a final error answer is a key conflict (see ConflictError): idemd's 422
 * problem of type PROBLEM_TYPE_CONFLICT, never replayed. Any other 422 (a business error an
 * effect answered, a stored failed effect, another API's validation error) is the
 * operation's own result, the same on the first answer and on a replay.
 */
export function isConflict(response: Response, problem: ProblemDetails): boolean {
  return response.status === 422 && !isReplayed(response) && problem.type === PROBLEM_TYPE_CONFLICT;
}

function problemOf(response: Response, body: string): ProblemDetails {
  const fallback: ProblemDetails = { type: "about:blank", title: response.statusText || `HTTP ${response.status}`, status: response.status };
  if (!/^application\/problem\+json\b/i.test(response.headers.get("Content-Type") ?? "")) return fallback;
  try {
    const p: unknown = JSON.parse(body);
    if (p === null || typeof p !== "object" || Array.isArray(p)) return fallback;
    const problem = p as Partial<ProblemDetails>;
    return { ...problem, type: typeof problem.type === "string" ? problem.type : "about:blank" };
  } catch {
    return fallback;
  }
}

// The retry arithmetic, the same as idemd's internal/retry (used by the Go client): capped
// exponential backoff with full jitter, Retry-After parsing, and which statuses are retried.

/** The longest Retry-After taken at its word (100 years); a larger number is cut to it. */
const retryAfterCeilingMs = 100 * 365 * 24 * 3600 * 1000;
const int64Max = 9223372036854775807n;

/**
 * The wait in ms before the next attempt after `failures` failed attempts: a uniformly
 * random integer in [0, min(max, min·2^(failures-1))] ("full jitter"), so that clients that
 * failed together do not retry together. `random` returns a number in [0, 1).
 */
export function backoff(min: number, max: number, failures: number, random: () => number): number {
  let cap = min * 2 ** (Math.min(Math.max(failures, 1), 31) - 1);
  if (cap <= 0 || cap > max) cap = max;
  if (cap <= 0) return 0;
  return Math.min(cap, Math.floor(random() * (cap + 1)));
}

/**
 * Parses a Retry-After value, delay-seconds or an HTTP date (RFC 9110 §10.2.3), into a wait
 * in ms from `now` (ms since the epoch). Returns undefined when the value is absent or
 * malformed; a date in the past is a zero wait.
 */
export function parseRetryAfter(value: string | null | undefined, now: number): number | undefined {
  const v = (value ?? "").trim();
  if (v === "") return undefined;
  if (/^[+-]?\d+$/.test(v)) {
    const secs = BigInt(v);
    if (secs < 0n || secs > int64Max) return undefined;
    return Number(secs) * 1000 > retryAfterCeilingMs ? retryAfterCeilingMs : Number(secs) * 1000;
  }
  const t = parseHttpDate(v);
  if (t === undefined) return undefined;
  return Math.max(t - now, 0);
}

const months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
const imfFixdate = /^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), (\d{2}) ([A-Z][a-z]{2}) (\d{4}) (\d{2}):(\d{2}):(\d{2}) GMT$/;
const rfc850 = /^(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday), (\d{2})-([A-Z][a-z]{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2}) GMT$/;
const asctime = /^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) ([A-Z][a-z]{2}) {1,2}(\d{1,2}) (\d{2}):(\d{2}):(\d{2}) (\d{4})$/;

/**
 * Parses an HTTP date in any of the three formats RFC 9110 §5.6.7 asks recipients to accept
 * (IMF-fixdate, RFC 850, asctime), as Go's http.ParseTime does, into ms since the epoch.
 * Unlike Date.parse, it reads every format as GMT on every runtime.
 */
export function parseHttpDate(value: string): number | undefined {
  let day: string, month: string, year: number, h: string, m: string, s: string;
  let match: RegExpExecArray | null;
  if ((match = imfFixdate.exec(value))) {
    [, day, month, , h, m, s] = match as unknown as string[];
    year = Number(match[3]);
  } else if ((match = rfc850.exec(value))) {
    [, day, month, , h, m, s] = match as unknown as string[];
    const yy = Number(match[3]);
    year = yy >= 69 ? 1900 + yy : 2000 + yy; // as Go's time package reads a two-digit year
  } else if ((match = asctime.exec(value))) {
    [, month, day, h, m, s] = match as unknown as string[];
    year = Number(match[6]);
  } else {
    return undefined;
  }
  const mon = months.indexOf(month);
  const [d, hh, mm, ss] = [Number(day), Number(h), Number(m), Number(s)];
  if (mon < 0 || hh > 23 || mm > 59 || ss > 59) return undefined;
  const t = Date.UTC(year, mon, d, hh, mm, ss);
  const check = new Date(t);
  if (check.getUTCFullYear() !== year || check.getUTCMonth() !== mon || check.getUTCDate() !== d) {
    return undefined; // a day the month does not have
  }
  return t;
}

/**
 * Reports whether an answer with this status is worth another attempt with the same key:
 * 409 (a request with this key is still in flight), 408, 425, 429 and every 5xx. Every other
 * 4xx says the request itself is wrong and would fail again.
 */
export function retryableStatus(status: number): boolean {
  return status === 409 || status === 408 || status === 425 || status === 429 || (status >= 500 && status <= 599);
}

// OpenSSL and Node codes of a certificate the client refuses: refused again on a retry.
const certificateError =
  /^(?:CERT_|ERR_TLS_CERT|UNABLE_TO_(?:GET_ISSUER_CERT|VERIFY_LEAF_SIGNATURE|DECRYPT_CERT)|DEPTH_ZERO_SELF_SIGNED_CERT|SELF_SIGNED_CERT_IN_CHAIN|INVALID_CA|PATH_LENGTH_EXCEEDED|INVALID_PURPOSE|HOSTNAME_MISMATCH)/;

// The ports the Fetch standard blocks (https://fetch.spec.whatwg.org/#bad-port): a fetch to
// one fails at once, on every runtime that follows it, before anything is sent.
const badPorts = new Set([
  1, 7, 9, 11, 13, 15, 17, 19, 20, 21, 22, 23, 25, 37, 42, 43, 53, 69, 77, 79, 87, 95, 101, 102, 103, 104, 109, 110,
  111, 113, 115, 117, 119, 123, 135, 137, 139, 143, 161, 179, 389, 427, 465, 512, 513, 514, 515, 526, 530, 531, 532,
  540, 548, 554, 556, 563, 587, 601, 636, 989, 990, 993, 995, 1719, 1720, 1723, 2049, 3659, 4045, 4190, 5060, 5061,
  6000, 6566, 6665, 6666, 6667, 6668, 6669, 6679, 6697, 10080,
]);

/**
 * Reports whether a fetch of `url` can never reach a server, whatever the network does: its
 * scheme is not http or https, or its port is one the Fetch standard blocks. Runtimes report
 * these as a bare "fetch failed" (Node: "unknown scheme", "bad port"; browsers say nothing),
 * so the URL, not the error, tells them apart.
 */
export function unreachableURL(url: string): boolean {
  const u = new URL(url);
  if (u.protocol !== "http:" && u.protocol !== "https:") return true;
  return u.port !== "" && badPorts.has(Number(u.port));
}

/**
 * Reports whether a failed fetch is worth another attempt. A network error may have
 * happened before or after the server applied the operation; the key makes the retry safe
 * either way, and a refused or reset connection or a timeout may pass next time. A
 * certificate the client refuses would be refused again (unreachableURL says which URLs
 * would fail again).
 */
export function retryableError(error: unknown): boolean {
  for (let e = error, depth = 0; e instanceof Object && depth < 8; depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && certificateError.test(code)) return false;
    e = (e as { cause?: unknown }).cause;
  }
  return true;
}

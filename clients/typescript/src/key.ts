/** The request header that carries the idempotency key. */
export const HEADER_IDEMPOTENCY_KEY = "Idempotency-Key";

/** The longest key idemd accepts. */
export const KEY_MAX_LENGTH = 255;

/**
 * Returns a fresh idempotency key, a random UUIDv4 from `crypto.randomUUID()`. Store it with
 * the operation when the operation must survive a restart (a pending mobile operation, a
 * job), and pass it as `key` when you send the operation again.
 */
export function newKey(): string {
  const c = (globalThis as { crypto?: { randomUUID?: () => string } }).crypto;
  if (typeof c?.randomUUID !== "function") {
    throw new TypeError(
      "idempotentFetch: crypto.randomUUID is not available in this runtime (it needs Node >= 20, a browser in a secure context, Deno or Bun); pass options.key",
    );
  }
  return c.randomUUID();
}

/** Reports whether k is 1 to 255 printable ASCII characters (space included), as idemd requires. */
export function validKey(k: string): boolean {
  return k.length >= 1 && k.length <= KEY_MAX_LENGTH && /^[\x20-\x7e]*$/.test(k);
}

/** Serializes a key as a Structured Fields string (RFC 9651), the form the draft standard gives the header. */
export function serializeKey(k: string): string {
  return `"${k.replace(/[\\"]/g, "\\$&")}"`;
}

/**
 * Reads the key from an Idempotency-Key header value: a Structured Fields string (`"k"`,
 * parameters ignored) or a bare key (`k`), which idemd takes for the same key. Throws a
 * TypeError for a malformed value or more than one key.
 */
export function parseKeyHeader(value: string): string {
  const v = value.replace(/^[ \t]+|[ \t]+$/g, "");
  let key: string;
  if (v.startsWith('"')) {
    const m = /^"((?:[\x20-\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"[ \t]*(.*)$/.exec(v);
    if (!m) throw new TypeError(`idempotentFetch: malformed Idempotency-Key header ${JSON.stringify(value)}`);
    if (m[2].startsWith(",")) throw new TypeError("idempotentFetch: more than one Idempotency-Key");
    if (m[2] !== "" && !m[2].startsWith(";")) {
      throw new TypeError(`idempotentFetch: malformed Idempotency-Key header ${JSON.stringify(value)}`);
    }
    key = m[1].replace(/\\(["\\])/g, "$1");
  } else {
    if (v.includes(",")) throw new TypeError("idempotentFetch: more than one Idempotency-Key");
    key = v;
  }
  if (!validKey(key)) {
    throw new TypeError(`idempotentFetch: an Idempotency-Key must be 1 to ${KEY_MAX_LENGTH} printable ASCII characters, got ${JSON.stringify(key)}`);
  }
  return key;
}

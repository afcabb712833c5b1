/**
 * Time as the client sees it: the current time (to turn a Retry-After date into a wait) and
 * sleeping (waits between attempts, the deadline, the attempt timeout). Tests pass a fake
 * clock to check waits without waiting.
 */
export interface Clock {
  /** Milliseconds since the Unix epoch, as `Date.now()`. */
  now(): number;
  /**
   * Resolves after `ms` milliseconds, or rejects with `signal.reason` as soon as `signal`
   * aborts (at once if it already has).
   */
  sleep(ms: number, signal?: AbortSignal): Promise<void>;
}

// setTimeout fires at once for delays above 2^31-1 ms (about 24.8 days); longer sleeps
// are cut into steps of this size.
const maxTimerDelay = 2 ** 31 - 1;

/** The clock of the runtime: `Date.now()` and `setTimeout`. */
export const realClock: Clock = {
  now: () => Date.now(),
  sleep(ms: number, signal?: AbortSignal): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      if (signal?.aborted) {
        reject(signal.reason);
        return;
      }
      let timer: ReturnType<typeof setTimeout>;
      const onAbort = () => {
        clearTimeout(timer);
        reject(signal?.reason);
      };
      let left = Math.max(0, ms);
      const step = () => {
        const d = Math.min(left, maxTimerDelay);
        left -= d;
        timer = setTimeout(() => {
          if (left > 0) {
            step();
            return;
          }
          signal?.removeEventListener("abort", onAbort);
          resolve();
        }, d);
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      step();
    });
  },
};

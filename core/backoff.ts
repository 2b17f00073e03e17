/**
 * The one full-jitter backoff of the project's busy retries: every wait for
 * a lock, a transaction or a server's rerun sleeps through it.
 *
 * @module
 */

/**
 * The longest backoff between busy retries, in milliseconds. SQLite queues
 * no lock waiters: a waiter only wins if it polls in the gap between another
 * writer's transactions, so the poll interval stays short.
 */
export const MAX_BUSY_BACKOFF_MS = 4;

/**
 * The backoff after `backoffMs`: doubled, at most
 * {@linkcode MAX_BUSY_BACKOFF_MS}.
 *
 * @param backoffMs The backoff just waited, in milliseconds.
 * @returns The next one, in milliseconds.
 */
export function nextBackoff(backoffMs: number): number {
  return Math.min(backoffMs * 2, MAX_BUSY_BACKOFF_MS);
}

/**
 * Waits a random 1 to `1 + backoffMs` ms, at most `remainingMs`: full
 * jitter (AWS's "Exponential Backoff And Jitter") keeps contending callers
 * apart.
 *
 * @param remainingMs The time left before the caller's deadline, in milliseconds.
 * @param backoffMs The jitter's span, in milliseconds.
 * @param random Random numbers in [0, 1).
 * @returns Resolves after the wait.
 */
export function jitteredWait(
  remainingMs: number,
  backoffMs: number,
  random: () => number = Math.random,
): Promise<void> {
  const ms = Math.min(remainingMs, 1 + random() * backoffMs);
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/**
 * Waits before the next try of a statement that found the database locked:
 * on the driver's lock when it can watch it (`busyWait`), with
 * {@linkcode jitteredWait} otherwise.
 *
 * @param driver The connection whose statement found the lock.
 * @param remainingMs The time left before the caller's deadline, in milliseconds.
 * @param backoffMs The jitter's span when the driver cannot watch its lock.
 * @returns Resolves when the caller may try again.
 */
export function lockWait(
  driver: { busyWait?(timeoutMs: number): Promise<void> },
  remainingMs: number,
  backoffMs: number,
): Promise<void> {
  return driver.busyWait !== undefined
    ? driver.busyWait(remainingMs)
    : jitteredWait(remainingMs, backoffMs);
}

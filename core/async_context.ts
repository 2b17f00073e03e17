/**
 * The runtime's `AsyncLocalStorage`, found by feature detection rather
 * than an import so the core stays runtime-neutral: how the transaction
 * runner tells a nested call, and a processor a `stop()` made by one of its
 * own handlers.
 *
 * @module
 */

/** The subset of `AsyncLocalStorage` the core uses. */
export interface AsyncContext<T> {
  run<R>(store: T, fn: () => R): R;
  getStore(): T | undefined;
}

/**
 * A new async context, where the runtime has `AsyncLocalStorage` (Deno,
 * Node.js, Bun); `undefined` where it has none (browsers).
 *
 * @ignore
 */
export function asyncContext<T>(): AsyncContext<T> | undefined {
  const process = (globalThis as {
    process?: { getBuiltinModule?(id: string): unknown };
  }).process;
  const hooks = process?.getBuiltinModule?.("node:async_hooks") as
    | { AsyncLocalStorage?: new () => AsyncContext<T> }
    | undefined;
  return hooks?.AsyncLocalStorage === undefined
    ? undefined
    : new hooks.AsyncLocalStorage();
}

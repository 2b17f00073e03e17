/**
 * Which of a processor's handlers the current async context runs inside,
 * so that a `stop()` made by a handler does not wait for that handler,
 * which would wait for itself. Told by `AsyncLocalStorage`
 * (`../core/async_context.ts`): where the runtime has none (browsers), no
 * call is found to come from a handler.
 *
 * @module
 */
import { asyncContext } from "../core/async_context.ts";

/** A running handler, as the async context of its code sees it. */
interface HandlerScope {
  readonly processor: object;
  readonly slot: object;
  readonly outer: HandlerScope | undefined;
}

const handlerScopes = asyncContext<HandlerScope>();

/** Runs `handler` as `processor`'s handler of `slot`, inside any outer one. */
export function runAsHandler<R>(
  processor: object,
  slot: object,
  handler: () => R,
): R {
  if (handlerScopes === undefined) return handler();
  const outer = handlerScopes.getStore();
  return handlerScopes.run({ processor, slot, outer }, handler);
}

/**
 * The slot of `processor`'s handler the current call is made from, if any
 * that `isOwn` accepts (a slot still held), innermost first.
 */
export function callingSlot<S extends object>(
  processor: object,
  isOwn: (slot: S) => boolean,
): S | undefined {
  for (let scope = handlerScopes?.getStore(); scope; scope = scope.outer) {
    if (scope.processor === processor && isOwn(scope.slot as S)) {
      return scope.slot as S;
    }
  }
  return undefined;
}

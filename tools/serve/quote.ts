/**
 * How an error message quotes a request value: bounded in length and never recursive, since the
 * value may be a hostile nesting.
 *
 * @module
 */

/**
 * A request value as an error message quotes it: a primitive as JSON (a long string cut short),
 * an array or object by its kind only, since quoting a hostile nesting would overflow the stack.
 */
export function shown(v: unknown): string {
  if (Array.isArray(v)) return "an array";
  if (typeof v === "object" && v !== null) return "an object";
  if (typeof v === "string" && v.length > 40) return `${JSON.stringify(v.slice(0, 40))}…`;
  return JSON.stringify(v);
}

/** "got <value>", or "it is missing" for an absent one. */
export function got(v: unknown): string {
  return v === undefined ? "it is missing" : `got ${shown(v)}`;
}

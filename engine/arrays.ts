/**
 * Joining typed arrays: one helper for the byte copies of caches (prompt cache, sessions), the
 * logits rows of a batched request and the fuzzer's spliced inputs.
 *
 * @module
 */

/** The arrays one after another in one new array of their kind (a single one as it is). */
export function concat<T extends Uint8Array | Float32Array>(
  parts: readonly T[],
  make: (length: number) => T,
): T {
  if (parts.length === 1) return parts[0];
  const out = make(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/**
 * Small numeric helpers of the synthetic checkpoint writer.
 *
 * @module
 */

/** `x` limited to [lo, hi]. */
export const clamp = (x: number, lo: number, hi: number): number => Math.min(hi, Math.max(lo, x));

/** `from, from + step, …` up to and including `to`. */
export function range(from: number, to: number, step: number): number[] {
  const out: number[] = [];
  for (let x = from; x <= to; x += step) out.push(x);
  return out;
}

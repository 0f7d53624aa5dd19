/**
 * Timings taken side by side: each measurement runs in turn, round after round, so a change in the
 * machine's load falls on all of them alike.
 *
 * @module
 */

/** Runs each of `runs` in turn for `rounds` rounds; the best (highest) result of each. */
export function bestAlternating(rounds: number, runs: (() => number)[]): number[] {
  const best = runs.map(() => 0);
  for (let i = 0; i < rounds; i++) runs.forEach((run, k) => best[k] = Math.max(best[k], run()));
  return best;
}

/** The median of `xs` (NaN when empty): what a bench keeps of its interleaved repeats. */
export function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b), n = s.length;
  return n === 0 ? NaN : n % 2 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

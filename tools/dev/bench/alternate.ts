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

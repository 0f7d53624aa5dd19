/**
 * The control block shared by the pool's main thread and its workers: where a dispatch is
 * published and how its rows are split. Both sides import this file so they agree exactly.
 *
 * @module
 */

/** Int32 slot indices of the control block header. */
export const CTL = {
  /** Incremented by the main thread to publish a dispatch. */
  GEN: 0,
  /** Workers that finished the current dispatch. */
  DONE: 1,
  /** Set to 1 to make workers exit at the next dispatch. */
  STOP: 2,
  /** Jobs in the current dispatch. */
  NJOBS: 3,
  /** Set by a worker whose kernel threw; the main thread reports it. */
  ERROR: 4,
} as const;

/** Bytes of the header before the job table. */
export const CTL_HEADER_BYTES = 64;
/** Float64 slots per job: kernel id, arg count, rows, BigInt mask, then the args. */
export const JOB_SLOTS = 32;
/** Most args one job can carry (the row range is appended by the pool). */
export const MAX_JOB_ARGS = JOB_SLOTS - 4;
/** Most jobs one dispatch can carry. */
export const MAX_JOBS = 64;
/** Bytes of the whole control block. */
export const CTL_BYTES = CTL_HEADER_BYTES + MAX_JOBS * JOB_SLOTS * 8;
/** Rows handed out together, so 4-row-blocked kernels stay blocked. */
export const ROW_BLOCK = 4;
/** Spins on the generation counter before parking in Atomics.wait (PLATFORM.md §4). */
export const SPIN = 2000;

/**
 * The rows participant `p` of `n` computes for a job of `rows` rows. Whole blocks of
 * {@link ROW_BLOCK}, in order, so the split depends only on (rows, n), never on timing.
 */
export function rowShare(rows: number, p: number, n: number): [number, number] {
  const blocks = Math.ceil(rows / ROW_BLOCK);
  const b0 = Math.floor((blocks * p) / n);
  const b1 = Math.floor((blocks * (p + 1)) / n);
  return [Math.min(rows, b0 * ROW_BLOCK), Math.min(rows, b1 * ROW_BLOCK)];
}

/** Calls `fn` on participant `p`'s share of every job published in `jobs`. */
export function runShare(
  fns: ((...a: (number | bigint)[]) => unknown)[],
  jobs: Float64Array,
  njobs: number,
  p: number,
  n: number,
): void {
  for (let j = 0; j < njobs; j++) {
    const base = j * JOB_SLOTS;
    const fn = fns[jobs[base]];
    const nargs = jobs[base + 1];
    const rows = jobs[base + 2];
    const mask = jobs[base + 3];
    const [r0, r1] = rowShare(rows, p, n);
    if (r0 >= r1) continue;
    const args: (number | bigint)[] = new Array(nargs + 2);
    for (let i = 0; i < nargs; i++) {
      const v = jobs[base + 4 + i];
      args[i] = (mask >>> i) & 1 ? BigInt(v) : v;
    }
    args[nargs] = r0;
    args[nargs + 1] = r1;
    fn(...args);
  }
}

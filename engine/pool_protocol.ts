/**
 * The control block shared by the pool's main thread and its workers: where a dispatch is
 * published and how its rows are handed out. Both sides import this file so they agree exactly.
 *
 * Rows are claimed in chunks from a per-job atomic counter, so a thread that was descheduled
 * (the machine is shared) does not hold up the others. Which thread computes a row never
 * changes its value: kernels compute each row the same way whatever range they are given.
 *
 * A dispatch is over when all its rows are computed (`FINISHED` reaches `TOTAL`), not when every
 * worker has checked in: a worker that the kernel scheduler kept off a core (the disk reader's
 * threads share the cores) joins late or not at all, and the main thread does not wait for it.
 * Workers join only while the dispatch is `OPEN` and count themselves in `ACTIVE`; the main
 * thread closes the dispatch and waits for `ACTIVE` to fall to 0 before it writes the next one.
 *
 * @module
 */

/** Int32 slot indices of the control block header. */
export const CTL = {
  /** Incremented by the main thread to publish a dispatch. */
  GEN: 0,
  /** Workers that saw the stop request and are exiting. */
  DONE: 1,
  /** Set to 1 to make workers exit at the next dispatch. */
  STOP: 2,
  /** Jobs in the current dispatch. */
  NJOBS: 3,
  /** Set by a worker whose kernel threw; the main thread reports it. */
  ERROR: 4,
  /** Rows of the current dispatch computed so far, over all its jobs. */
  FINISHED: 5,
  /** 1 while workers may join the published dispatch; 0 while the main thread writes one. */
  OPEN: 6,
  /** Workers inside a dispatch (joined and not yet left). */
  ACTIVE: 7,
  /** Rows of the current dispatch over all its jobs: it is over when FINISHED reaches this. */
  TOTAL: 8,
  /** First of the per-job claim counters (next chunk to hand out). */
  CLAIM: 16,
} as const;
/**
 * Float64 slots of a job's header: kernel id, arg count, rows, BigInt mask, and the rows of all
 * earlier jobs that must be computed before its own start (0: none; see {@link runJobs}).
 */
export const JOB_HEADER = 5;
/** Most args one job can carry (the row range is appended by the pool). */
export const MAX_JOB_ARGS = 28;
/** Float64 slots per job: the header, then the args. */
export const JOB_SLOTS = JOB_HEADER + MAX_JOB_ARGS;
/** Most jobs one dispatch can carry. */
export const MAX_JOBS = 64;
/** Bytes of the header (flags and claim counters) before the job table. */
export const CTL_HEADER_BYTES = (CTL.CLAIM + MAX_JOBS) * 4;
/** Bytes of the whole control block. */
export const CTL_BYTES = CTL_HEADER_BYTES + MAX_JOBS * JOB_SLOTS * 8;
/** Rows handed out together, so 4-row-blocked kernels stay blocked. */
export const ROW_BLOCK = 4;
/**
 * Spins on the generation counter before parking in Atomics.wait: tens of microseconds, because
 * waking a parked worker costs 24–38 µs here (PLATFORM.md §4, docs/PERFORMANCE.md).
 */
export const SPIN = 20000;

/** Rows per claimed chunk: about 8 chunks per thread, whole 4-row blocks. */
export function chunkRows(rows: number, threads: number): number {
  const per = Math.ceil(rows / (threads * 8));
  return Math.max(ROW_BLOCK, Math.ceil(per / ROW_BLOCK) * ROW_BLOCK);
}

/** Arguments of job `j` as the kernel takes them, with room for the row range at the end. */
function jobArgs(jobs: Float64Array, j: number): (number | bigint)[] {
  const base = j * JOB_SLOTS;
  const nargs = jobs[base + 1];
  const mask = jobs[base + 3];
  const args: (number | bigint)[] = new Array(nargs + 2);
  for (let i = 0; i < nargs; i++) {
    const v = jobs[base + JOB_HEADER + i];
    args[i] = (mask >>> i) & 1 ? BigInt(v) : v;
  }
  return args;
}

/** Spins before a thread waiting for earlier jobs' rows sleeps in short timed waits. */
const AFTER_SPIN = 4000;

/**
 * Waits until `rows` rows of the dispatch are computed (a job run `after` the earlier ones); false
 * when a thread's kernel threw instead, so those rows never will be.
 */
function awaitFinished(words: Int32Array, rows: number): boolean {
  let spins = 0;
  for (;;) {
    const done = Atomics.load(words, CTL.FINISHED);
    if (done >= rows) return true;
    if (Atomics.load(words, CTL.ERROR) !== 0) return false;
    // A preempted thread holds a chunk: then sleep in short waits rather than spin away its core.
    if (spins++ >= AFTER_SPIN) Atomics.wait(words, CTL.FINISHED, done, 0.05);
  }
}

/**
 * Runs the published jobs in order. Alone (`words` null), each job runs whole; in a pool, the
 * thread claims chunks of each job's rows from the job's counter in `words` until none are left,
 * and counts the rows it computed in `CTL.FINISHED`. A job whose header names earlier rows (it
 * reads earlier jobs' outputs) starts only once that many rows are computed: a thread that
 * reaches it has claimed every chunk before it, so it waits only for chunks other threads are
 * running.
 */
export function runJobs(
  fns: ((...a: (number | bigint)[]) => unknown)[],
  jobs: Float64Array,
  njobs: number,
  words: Int32Array | null,
  threads: number,
): void {
  for (let j = 0; j < njobs; j++) {
    const fn = fns[jobs[j * JOB_SLOTS]];
    const rows = jobs[j * JOB_SLOTS + 2];
    // A thread that arrives late finds every chunk handed out: skip building the arguments.
    const chunk = words ? chunkRows(rows, threads) : rows;
    if (words && Atomics.load(words, CTL.CLAIM + j) * chunk >= rows) continue;
    const args = jobArgs(jobs, j);
    const n = args.length;
    if (!words) {
      args[n - 2] = 0;
      args[n - 1] = rows;
      fn(...args);
      continue;
    }
    const after = jobs[j * JOB_SLOTS + 4];
    if (after > 0 && !awaitFinished(words, after)) return;
    for (;;) {
      const r0 = Atomics.add(words, CTL.CLAIM + j, 1) * chunk;
      if (r0 >= rows) break;
      const r1 = Math.min(rows, r0 + chunk);
      args[n - 2] = r0;
      args[n - 1] = r1;
      fn(...args);
      const done = Atomics.add(words, CTL.FINISHED, r1 - r0) + r1 - r0;
      if (done === Atomics.load(words, CTL.TOTAL)) Atomics.notify(words, CTL.FINISHED);
    }
  }
}

/**
 * The worker pool: the main thread plus N−1 Deno workers, all running the same kernels module on
 * the shared arena. A dispatch is a list of row-parallel jobs published in a control block inside
 * the arena and started with one Atomics.notify; no postMessage per operation. Threads claim rows
 * in chunks, so a descheduled thread on a shared machine does not stall the rest.
 *
 * Results never depend on the thread count: every kernel computes each output row the same way
 * whatever rows its neighbours got, and a dot product is never split across threads.
 *
 * @module
 */
import type { Arena } from "./arena.ts";
import {
  CTL,
  CTL_BYTES,
  CTL_HEADER_BYTES,
  JOB_HEADER,
  JOB_SLOTS,
  MAX_JOB_ARGS,
  MAX_JOBS,
  runJobs,
} from "./pool_protocol.ts";

/** One row-parallel kernel call; the pool appends the row range `(r0, r1)` to `args`. */
export interface Job {
  /** Exported kernel name. */
  kernel: string;
  /** Arguments before the row range: bigint for pointers, number for ints and floats. */
  args: (number | bigint)[];
  /** Rows to split. */
  rows: number;
  /**
   * The job (and every job after it) may read outputs of the jobs before it in its dispatch: its
   * rows start only once all of theirs are computed, with no return to the main thread between.
   */
  after?: boolean;
}

/** Dispatches whose total work (rows × cols summed) is below this run on the main thread alone. */
export const MIN_PARALLEL_WORK = 1 << 15;

type KernelFn = (...a: (number | bigint)[]) => unknown;

/** Threads to use by default: all cores (the main thread counts as one). */
export function defaultThreads(): number {
  return Math.max(1, navigator.hardwareConcurrency || 1);
}

/** A pool of kernel threads on one arena. */
export class Pool {
  /** Kernel exports of the main thread's instance, for calls that are not worth splitting. */
  readonly exports: Record<string, KernelFn>;
  /** Threads that compute, including the main thread. */
  readonly threads: number;
  /** Dispatches that used the workers, and those that ran on the main thread alone. */
  readonly counts = { parallel: 0, serial: 0 };
  #words: Int32Array;
  #jobs: Float64Array;
  /** The job table of dispatches that run on the main thread alone. */
  #serialJobs = new Float64Array(MAX_JOBS * JOB_SLOTS);
  #ids: Map<string, number>;
  #fns: KernelFn[];
  #workers: Worker[];
  #closed = false;

  private constructor(
    exports: Record<string, KernelFn>,
    names: string[],
    words: Int32Array,
    jobs: Float64Array,
    workers: Worker[],
  ) {
    this.exports = exports;
    this.#ids = new Map(names.map((n, i) => [n, i]));
    this.#fns = names.map((n) => exports[n]);
    this.#words = words;
    this.#jobs = jobs;
    this.#workers = workers;
    this.threads = workers.length + 1;
  }

  /** Instantiates the kernels on `arena` on this thread and on `threads − 1` workers. */
  static async create(
    arena: Arena,
    module: WebAssembly.Module,
    threads = defaultThreads(),
  ): Promise<Pool> {
    if (!Number.isInteger(threads) || threads < 1) {
      throw new Error(`pool: threads must be a positive integer, got ${threads}`);
    }
    const memory = arena.memory;
    const instance = await WebAssembly.instantiate(module, { env: { memory } });
    const exports = instance.exports as Record<string, KernelFn>;
    const names = Object.keys(exports).filter((k) => typeof exports[k] === "function").sort();
    const ctl = arena.alloc("pool control block", CTL_BYTES);
    const words = arena.i32(ctl, CTL_HEADER_BYTES / 4);
    const jobs = new Float64Array(memory.buffer, ctl + CTL_HEADER_BYTES, MAX_JOBS * JOB_SLOTS);
    const url = new URL("./pool_worker.ts", import.meta.url).href;
    const workers: Worker[] = [];
    const ready: Promise<void>[] = [];
    for (let i = 1; i < threads; i++) {
      const w = new Worker(url, { type: "module" });
      workers.push(w);
      ready.push(
        new Promise((resolve, reject) => {
          w.onmessage = (ev) => {
            if (ev.data === "ready") resolve();
            else console.error(`pool worker ${i}: ${ev.data?.error ?? ev.data}`);
          };
          w.onerror = (ev) => {
            ev.preventDefault();
            reject(new Error(`pool worker ${i} failed to start: ${ev.message}`));
          };
        }),
      );
      w.postMessage({ module, memory, ctl, participants: threads, names });
    }
    await Promise.all(ready);
    return new Pool(exports, names, words, jobs, workers);
  }

  /** Runs one row-parallel kernel over `rows` rows; `work` sizes the split decision. */
  run1(kernel: string, args: (number | bigint)[], rows: number, work = rows): void {
    this.run([{ kernel, args, rows }], work);
  }

  /**
   * Runs `jobs` in order, each split by rows over all threads, and returns when all are done.
   * A job reads the outputs of earlier jobs of the dispatch only when marked `after`.
   */
  run(jobs: Job[], work: number): void {
    if (this.#closed) throw new Error("pool: used after close()");
    if (jobs.length > MAX_JOBS) throw new Error(`pool: ${jobs.length} jobs > ${MAX_JOBS}`);
    const serial = this.#workers.length === 0 || work < MIN_PARALLEL_WORK;
    // A worker that joined the last dispatch late may still read the shared table: close it to
    // them before writing. Serial dispatches use a table of their own, which no worker reads.
    if (!serial) this.#quiesce();
    const table = serial ? this.#serialJobs : this.#jobs;
    let before = 0;
    for (let j = 0; j < jobs.length; j++) {
      const { kernel, args, rows, after } = jobs[j];
      const id = this.#ids.get(kernel);
      if (id === undefined) throw new Error(`pool: no kernel named ${kernel}`);
      if (args.length > MAX_JOB_ARGS) throw new Error(`pool: ${kernel} has too many args`);
      const base = j * JOB_SLOTS;
      let mask = 0;
      for (let i = 0; i < args.length; i++) {
        const a = args[i];
        if (typeof a === "bigint") {
          mask |= 1 << i;
          table[base + JOB_HEADER + i] = Number(a);
        } else table[base + JOB_HEADER + i] = a;
      }
      table[base] = id;
      table[base + 1] = args.length;
      table[base + 2] = rows;
      table[base + 3] = mask;
      table[base + 4] = after ? before : 0;
      before += rows;
    }
    if (serial) {
      this.counts.serial++;
      runJobs(this.#fns, table, jobs.length, null, 1);
      return;
    }
    this.counts.parallel++;
    const w = this.#words;
    for (let j = 0; j < jobs.length; j++) w[CTL.CLAIM + j] = 0;
    Atomics.store(w, CTL.NJOBS, jobs.length);
    Atomics.store(w, CTL.FINISHED, 0);
    Atomics.store(w, CTL.TOTAL, before);
    Atomics.add(w, CTL.GEN, 1);
    Atomics.store(w, CTL.OPEN, 1);
    Atomics.notify(w, CTL.GEN);
    try {
      runJobs(this.#fns, table, jobs.length, w, this.threads);
    } catch (e) {
      // Workers waiting for this thread's rows (jobs run `after`) stop on the flag.
      Atomics.store(w, CTL.ERROR, 1);
      this.#abandon();
      throw e;
    }
    this.#awaitRows(before);
    if (Atomics.load(w, CTL.ERROR) !== 0) {
      this.#abandon();
      // Rerun on this thread so the kernel's own exception, with its stack, is what the caller sees.
      runJobs(this.#fns, table, jobs.length, null, 1);
      throw new Error("pool: a worker failed but the rerun on the main thread succeeded");
    }
  }

  /** Waits until all `total` rows of the dispatch are computed, or a worker's kernel threw. */
  #awaitRows(total: number): void {
    const w = this.#words;
    let spins = 0;
    for (;;) {
      const done = Atomics.load(w, CTL.FINISHED);
      if (done >= total || Atomics.load(w, CTL.ERROR) !== 0) return;
      if (spins++ < 4000) continue;
      // A worker's kernel that throws sets ERROR without finishing its rows: wake to look.
      Atomics.wait(w, CTL.FINISHED, done, 50);
    }
  }

  /**
   * After a kernel threw: waits for the workers inside the dispatch to leave, then reopens it
   * with no jobs, so a worker that comes late runs nothing (and none waits on a closed one).
   */
  #abandon(): void {
    const w = this.#words;
    this.#quiesce();
    Atomics.store(w, CTL.ERROR, 0);
    Atomics.store(w, CTL.NJOBS, 0);
    Atomics.store(w, CTL.OPEN, 1);
  }

  /** Closes the dispatch to late workers and waits for those inside it to leave. */
  #quiesce(): void {
    const w = this.#words;
    Atomics.store(w, CTL.OPEN, 0);
    let spins = 0;
    while (Atomics.load(w, CTL.ACTIVE) !== 0) {
      if (spins++ >= 4000) Atomics.wait(w, CTL.ACTIVE, Atomics.load(w, CTL.ACTIVE), 1);
    }
  }

  /** Stops and joins the workers. A worker parked in Atomics.wait survives terminate(), so stop it first. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    if (this.#workers.length === 0) return;
    const w = this.#words;
    this.#quiesce();
    Atomics.store(w, CTL.STOP, 1);
    Atomics.store(w, CTL.DONE, 0);
    Atomics.add(w, CTL.GEN, 1);
    Atomics.store(w, CTL.OPEN, 1);
    Atomics.notify(w, CTL.GEN);
    const n = this.#workers.length;
    for (let done = Atomics.load(w, CTL.DONE); done < n; done = Atomics.load(w, CTL.DONE)) {
      Atomics.wait(w, CTL.DONE, done, 50);
    }
    for (const worker of this.#workers) worker.terminate();
  }
}

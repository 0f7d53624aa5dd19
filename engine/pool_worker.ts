/**
 * A pool worker: instantiates the kernels on the shared arena, then waits on the control block's
 * generation counter and runs its share of each dispatch. Started by engine/pool.ts only.
 *
 * @module
 */
import { CTL, CTL_HEADER_BYTES, JOB_SLOTS, MAX_JOBS, runJobs, SPIN } from "./pool_protocol.ts";

interface Init {
  module: WebAssembly.Module;
  memory: WebAssembly.Memory;
  ctl: number;
  participants: number;
  names: string[];
}

/** This module runs in a worker; it is type-checked with the window globals, so name what it uses. */
const scope = self as unknown as {
  onmessage: (ev: MessageEvent<Init>) => void;
  postMessage(message: unknown): void;
  close(): void;
};

scope.onmessage = async (ev: MessageEvent<Init>) => {
  const { module, memory, ctl, participants, names } = ev.data;
  const instance = await WebAssembly.instantiate(module, { env: { memory } });
  const exports = instance.exports as Record<string, (...a: (number | bigint)[]) => unknown>;
  const fns = names.map((n) => exports[n]);
  const words = new Int32Array(memory.buffer, ctl, CTL_HEADER_BYTES / 4);
  const jobs = new Float64Array(memory.buffer, ctl + CTL_HEADER_BYTES, MAX_JOBS * JOB_SLOTS);
  let seen = Atomics.load(words, CTL.GEN);
  // "ready" only after reading GEN, or the first dispatch could be missed (PLATFORM.md §7).
  scope.postMessage("ready");
  for (;;) {
    let spins = 0;
    while (Atomics.load(words, CTL.GEN) === seen && spins < SPIN) spins++;
    if (Atomics.load(words, CTL.GEN) === seen) Atomics.wait(words, CTL.GEN, seen);
    // Join only an open dispatch: while it is closed the main thread is writing the next one
    // (a few microseconds), so look again without giving up on it. Once counted in ACTIVE with
    // the dispatch open, the main thread cannot close it and write another under this worker, so
    // GEN, read after OPEN, names the dispatch this worker runs.
    if (Atomics.load(words, CTL.OPEN) === 0) continue;
    Atomics.add(words, CTL.ACTIVE, 1);
    let stop = false;
    if (Atomics.load(words, CTL.OPEN) === 1) {
      seen = Atomics.load(words, CTL.GEN);
      stop = Atomics.load(words, CTL.STOP) === 1;
      if (!stop) {
        try {
          runJobs(fns, jobs, Atomics.load(words, CTL.NJOBS), words, participants);
        } catch (e) {
          Atomics.store(words, CTL.ERROR, 1);
          Atomics.notify(words, CTL.FINISHED);
          scope.postMessage({ error: String(e) });
        }
      }
    }
    if (Atomics.sub(words, CTL.ACTIVE, 1) === 1) Atomics.notify(words, CTL.ACTIVE);
    if (stop) {
      Atomics.add(words, CTL.DONE, 1);
      Atomics.notify(words, CTL.DONE);
      break;
    }
  }
  scope.close();
};

/**
 * The request queue: up to `parallel` requests run at once (each generation on its own sequence
 * of the model's batch, engine/batch.ts, their passes shared), the rest wait in arrival order,
 * a bounded number of them. A full queue refuses at once (the caller answers 429 with
 * Retry-After) instead of letting latency grow without bound.
 *
 * @module
 */

/** Thrown by {@link RequestQueue.run} when the queue is full. */
export class QueueFull extends Error {
  constructor(readonly waiting: number) {
    super(`the server is busy: ${waiting} request(s) already waiting`);
  }
}

/** Thrown by {@link RequestQueue.run} when the caller gave up while waiting. */
export class Abandoned extends Error {
  constructor() {
    super("the client went away while its request was queued");
  }
}

/** Runs up to `parallel` jobs at once; at most `capacity` wait behind the running ones. */
export class RequestQueue {
  readonly capacity: number;
  readonly parallel: number;
  #running = 0;
  #waiting: { start: () => void; fail: (e: Error) => void }[] = [];

  constructor(capacity: number, parallel = 1) {
    this.capacity = capacity;
    this.parallel = parallel;
  }

  /** Jobs waiting (not counting the running ones). */
  get waiting(): number {
    return this.#waiting.length;
  }

  /** Jobs running. */
  get running(): number {
    return this.#running;
  }

  /** Whether every job slot is taken (a new job would wait). */
  get busy(): boolean {
    return this.#running >= this.parallel;
  }

  /** Runs `job` when its turn comes; rejects at once when full, or when `signal` aborts first. */
  async run<T>(job: () => Promise<T>, signal?: AbortSignal): Promise<T> {
    if (this.busy || this.#waiting.length > 0) {
      if (this.#waiting.length >= this.capacity) throw new QueueFull(this.#waiting.length);
      await new Promise<void>((start, fail) => {
        const entry = { start, fail };
        this.#waiting.push(entry);
        signal?.addEventListener("abort", () => {
          const i = this.#waiting.indexOf(entry);
          if (i >= 0) {
            this.#waiting.splice(i, 1);
            fail(new Abandoned());
          }
        }, { once: true });
      });
      // Started by a finishing job, which handed its slot over.
    } else {
      this.#running++;
    }
    try {
      return await job();
    } finally {
      const next = this.#waiting.shift();
      if (next) next.start();
      else this.#running--;
    }
  }
}

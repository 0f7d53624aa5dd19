/**
 * The request queue: one model, so one generation at a time, in arrival order, with a bounded
 * number waiting. A full queue refuses at once (the caller answers 429 with Retry-After) instead
 * of letting latency grow without bound.
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

/** Runs jobs one at a time; at most `capacity` wait behind the running one. */
export class RequestQueue {
  readonly capacity: number;
  #running = false;
  #waiting: { start: () => void; fail: (e: Error) => void }[] = [];

  constructor(capacity: number) {
    this.capacity = capacity;
  }

  /** Jobs waiting (not counting the running one). */
  get waiting(): number {
    return this.#waiting.length;
  }

  /** Whether a job is running. */
  get busy(): boolean {
    return this.#running;
  }

  /** Runs `job` when its turn comes; rejects at once when full, or when `signal` aborts first. */
  async run<T>(job: () => Promise<T>, signal?: AbortSignal): Promise<T> {
    if (this.#running) {
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
    }
    this.#running = true;
    try {
      return await job();
    } finally {
      const next = this.#waiting.shift();
      if (next) next.start();
      else this.#running = false;
    }
  }
}

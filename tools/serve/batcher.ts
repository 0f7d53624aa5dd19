/**
 * The server's batcher: up to `parallel` requests generate at once, each on its own sequence of
 * the model (engine/batch.ts), their forward passes shared; the rest wait in the bounded queue
 * (tools/serve/queue.ts; a full one answers 429). Each generation runs on the free sequence whose
 * cache holds most of its user's prompt (engine/prefix_cache.ts), so a user's next turn continues
 * its own cache and never another user's.
 *
 * @module
 */
import { Batch } from "../../engine/batch.ts";
import type { PrefixCache } from "../../engine/prefix_cache.ts";
import {
  emptyTimings,
  type GeneratedToken,
  type GenerateOptions,
  type Session,
} from "../../engine/session.ts";
import type { Timings } from "../../engine/stats.ts";
import { RequestQueue } from "./queue.ts";

/** One generation of the batch: its tokens, and its sequence's timings once it has started. */
export interface BatchedGeneration {
  readonly tokens: AsyncGenerator<GeneratedToken>;
  readonly timings: Timings;
}

/** Admits requests to the batch and runs their generations on its sequences. */
export class Batcher {
  readonly batch: Batch;
  readonly queue: RequestQueue;
  readonly #prefixes: PrefixCache;

  /** A batcher over `session` (opened with its `parallel` sequences); `queueSize` may wait. */
  constructor(session: Session, prefixes: PrefixCache, queueSize: number) {
    this.batch = new Batch(session);
    this.queue = new RequestQueue(queueSize, this.batch.capacity);
    this.#prefixes = prefixes;
  }

  /** Runs `job` (which may call {@link generate}, one generation at a time) when admitted. */
  run<T>(job: () => Promise<T>, signal?: AbortSignal): Promise<T> {
    return this.queue.run(job, signal);
  }

  /**
   * A generation of `user`'s prompt `ids`, inside a job of {@link run}: once started it takes
   * a free sequence (the one caching most of the prompt for this user), readies its cache, and
   * gives the sequence back when it ends.
   */
  generate(user: string, ids: number[], opts: GenerateOptions): BatchedGeneration {
    const { batch } = this;
    const prefixes = this.#prefixes;
    let timings = emptyTimings();
    async function* tokens(): AsyncGenerator<GeneratedToken> {
      const seq = batch.reserve((free) => prefixes.choose(user, ids, free));
      if (seq === null) throw new Error("every sequence is taken: generate runs inside a job");
      try {
        prefixes.prepare(user, ids, seq);
        timings = batch.timings(seq);
        yield* batch.generate(seq, ids, opts);
      } finally {
        prefixes.finish(seq);
        batch.release(seq);
      }
    }
    return {
      tokens: tokens(),
      get timings() {
        return timings;
      },
    };
  }
}

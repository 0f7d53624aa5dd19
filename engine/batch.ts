/**
 * Continuous batching: several generations of one session at once, each on its own sequence (a
 * KV cache or recurrent state of its own in the arena: the model is opened with
 * `parallel` sequences), their forward passes run together. A pass holds one token of every
 * decoding sequence and, in the rows left, prompt chunks of the sequences still reading their
 * prompt, so a new request starts while the others keep decoding. The feed-forward runs over all
 * rows of a pass, so each routed expert is read once for the batch: beyond RAM, where a pass
 * costs its reads, several sequences decode for little more than the price of one.
 *
 * Each generation is the session's own generate loop (engine/session.ts `generateOn`) with its
 * passes handed to the batch; a pass runs once every running generation has asked for its next
 * one. A sequence's tokens are the ones it would get alone (greedy, or sampled from its own seed),
 * whatever else shares its passes: each row is computed as it would be alone.
 *
 * The consumers of the generations must keep pulling their tokens (or return): a pass waits for
 * every running generation.
 *
 * @module
 */
import { emptyTimings, type GeneratedToken, type GenerateOptions, type Lane } from "./session.ts";
import type { Session } from "./session.ts";
import { concat } from "./arrays.ts";
import type { Timings } from "./stats.ts";
import { PassInterrupted, type SequenceRows } from "./transformer.ts";

/** A sequence's request for a pass; a long one runs over several passes, `done` rows so far. */
interface Request {
  seq: number;
  tokens: number[];
  pos: number;
  allLogits: boolean;
  /** The generation's; once aborted, a pass holding these rows may end between layers. */
  signal?: AbortSignal;
  done: number;
  /** With allLogits, the logits of the rows run so far. */
  parts: Float32Array[];
  resolve: (logits: Float32Array) => void;
  reject: (e: unknown) => void;
}

/** Counters of a batch's passes, for stats and `/metrics`. */
export interface BatchTotals {
  /** Forward passes run. */
  passes: number;
  /** Rows (tokens) run, prompt and decode. */
  rows: number;
  /** Sequences summed over passes: ÷ passes is the mean batch size. */
  sequences: number;
  /** Sequences in the last pass. */
  lastSequences: number;
}

/** Several generations of one session, their passes run together (see the module doc). */
export class Batch {
  readonly session: Session;
  /** Sequences that can generate at once: the model's `parallel`. */
  readonly capacity: number;
  /** Counters of the passes so far. */
  readonly totals: BatchTotals = { passes: 0, rows: 0, sequences: 0, lastSequences: 0 };
  #lanes: Lane[];
  #reserved: boolean[];
  /** Generations running (between their first step and their end). */
  #live = 0;
  /** No mixer keeps a recurrent state: a sequence's rows may run again (see #pass). */
  #rewindable: boolean;
  /** Each running generation's request for its next pass, in arrival order. */
  #pending: Request[] = [];

  /** A batch over `session`'s model, with as many sequences as it was opened with. */
  constructor(session: Session) {
    this.session = session;
    this.capacity = session.model.transformer.sequences;
    this.#rewindable = session.model.transformer.stateRegions(0).length === 0;
    this.#reserved = new Array(this.capacity).fill(false);
    this.#lanes = Array.from({ length: this.capacity }, (_, seq) => ({
      seq,
      timings: emptyTimings(),
      forward: (tokens, pos, allLogits, signal) =>
        this.#request(seq, tokens, pos, allLogits ?? false, signal),
      // A draft model keeps one cache of its own: it drafts only while one sequence is all there
      // is; prompt lookup and the MTP layer (a cache per sequence) draft on every sequence, each
      // verify pass one request of the batch's pass.
      speculate: this.capacity === 1 || (session.speculation?.perSequence ?? false),
    }));
  }

  /** Sequences not reserved, in order. */
  get free(): number[] {
    return this.#reserved.flatMap((r, seq) => (r ? [] : [seq]));
  }

  /** Generations running now. */
  get active(): number {
    return this.#live;
  }

  /**
   * Reserves a free sequence for a generation: the one `choose` picks among the free ones (a
   * prefix cache picks the one holding most of the prompt, engine/prefix_cache.ts), else the
   * first; null when every sequence is taken.
   */
  reserve(choose?: (free: readonly number[]) => number): number | null {
    const free = this.free;
    if (free.length === 0) return null;
    const seq = choose ? choose(free) : free[0];
    if (!free.includes(seq)) throw new Error(`sequence ${seq} is not free`);
    this.#reserved[seq] = true;
    return seq;
  }

  /** Frees sequence `seq` for another generation (its caches stay, as a prompt cache). */
  release(seq: number): void {
    this.#reserved[seq] = false;
  }

  /** Timings of the last generation on sequence `seq`. */
  timings(seq: number): Timings {
    return this.#lane(seq).timings;
  }

  /**
   * Generates from `prompt` on reserved sequence `seq` as Session.generate does, its passes
   * shared with the batch's other generations. When it ends, its timings become the session's
   * (what Session.stats reports).
   */
  async *generate(
    seq: number,
    prompt: string | number[],
    opts: GenerateOptions = {},
  ): AsyncGenerator<GeneratedToken> {
    const lane = this.#lane(seq);
    if (!this.#reserved[seq]) throw new Error(`sequence ${seq} is not reserved`);
    Object.assign(lane.timings, emptyTimings());
    this.#live++;
    try {
      yield* this.session.generateOn(lane, prompt, opts);
    } finally {
      // The session's own timings (Session.stats) are those of the last generation to end.
      const t = lane.timings;
      Object.assign(this.session.timings, { ...t, decode: { ...t.decode } });
      this.#live--;
      this.#run();
    }
  }

  #lane(seq: number): Lane {
    const lane = this.#lanes[seq];
    if (!lane) throw new Error(`sequence ${seq}: the batch has ${this.capacity}`);
    return lane;
  }

  /** Queues sequence `seq`'s next pass; it runs once every running generation has asked. */
  #request(
    seq: number,
    tokens: number[],
    pos: number,
    allLogits: boolean,
    signal?: AbortSignal,
  ): Promise<Float32Array> {
    return new Promise((resolve, reject) => {
      const parts: Float32Array[] = [];
      this.#pending.push({ seq, tokens, pos, allLogits, signal, done: 0, parts, resolve, reject });
      this.#run();
    });
  }

  /** Runs passes while every running generation waits for one. */
  #run(): void {
    while (this.#pending.length > 0 && this.#pending.length >= this.#live) this.#pass();
  }

  /**
   * One pass: a token of each decoding sequence first, then prompt rows in arrival order, up to
   * the rows a pass holds. A request with rows left over keeps its place for the next pass.
   */
  #pass(): void {
    const model = this.session.model;
    let room = model.prefillChunk;
    const order = [
      ...this.#pending.filter((r) => r.tokens.length - r.done === 1),
      ...this.#pending.filter((r) => r.tokens.length - r.done > 1),
    ];
    const taken: [Request, number][] = [];
    for (const r of order) {
      const n = Math.min(r.tokens.length - r.done, room);
      if (n === 0) break;
      taken.push([r, n]);
      room -= n;
    }
    const rows: SequenceRows[] = taken.map(([r, n]) => ({
      seq: r.seq,
      tokens: r.tokens.slice(r.done, r.done + n),
      pos: r.pos + r.done,
      allLogits: r.allLogits,
    }));
    const cancelled = () => taken.filter(([r]) => r.signal?.aborted).length;
    // A cancelled request's rows stop the pass between layers when every other sequence in it
    // can run its rows again next pass: cache rows beyond what a sequence holds are rewritten
    // before any query reads them, but a recurrent state cannot rewind.
    const stop = () => {
      const n = cancelled();
      return n > 0 && (this.#rewindable || n === taken.length);
    };
    let out: Float32Array[];
    try {
      out = model.forwardBatch(rows, stop);
    } catch (e) {
      const interrupted = e instanceof PassInterrupted;
      for (const [r] of taken) {
        // The others keep their place and run their rows in the next pass.
        if (!interrupted || r.signal?.aborted) this.#settle(r, () => r.reject(e));
      }
      return;
    }
    this.totals.passes++;
    this.totals.rows += model.prefillChunk - room;
    this.totals.sequences += taken.length;
    this.totals.lastSequences = taken.length;
    taken.forEach(([r, n], i) => {
      r.done += n;
      if (r.allLogits) r.parts.push(out[i]);
      if (r.done < r.tokens.length) return;
      this.#settle(
        r,
        () => r.resolve(r.allLogits ? concat(r.parts, (n) => new Float32Array(n)) : out[i]),
      );
    });
  }

  /** Takes `r` off the pending list and answers it. */
  #settle(r: Request, answer: () => void): void {
    this.#pending.splice(this.#pending.indexOf(r), 1);
    answer();
  }
}

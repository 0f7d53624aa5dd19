/**
 * The KV cache's unwritten rows lent to the expert cache. The planner charges every sequence's
 * KV cache at the full context, so a long context is never an out-of-memory at token N; but a
 * context short of its maximum leaves most of those bytes untouched. Each position-indexed run of
 * a layer's state (GQA's keys and its values, MLA's latent rows and indexer rows) fills from its
 * first row up, so its top is free until the context reaches it: whole expert slots there are
 * lent to the cache, the ones the context reaches last first. Before a pass writes rows the
 * sequence's reservation grows, in blocks of {@link GROWTH_ROWS} rows, over every lent slot the
 * block touches: a read still landing there is waited for, the record evicted, the slot retired.
 * When a sequence starts over lower (a new prompt, a rewind) the room above comes back to the
 * cache. A ring (a sliding-window layer) never grows past its rows.
 *
 * Placement only: which slot holds a record never changes what the kernels compute.
 *
 * @module
 */
import { PAGE } from "./arena.ts";

/** Rows a sequence's reservation grows by at a time. */
export const GROWTH_ROWS = 256;

/**
 * One position-indexed run of a state region: `rows` rows of `rowBytes` from `offset` (an arena
 * offset, or relative to the page-aligned start of the layer's region in a plan); position p
 * writes row p (p mod rows for a ring), so rows at or above the context are unwritten.
 */
export interface RowRun {
  offset: number;
  rows: number;
  rowBytes: number;
}

/** Room for one expert slot at the top of a run of sequence `seq`. */
export interface LendableSlot {
  seq: number;
  /** Page-aligned start of the slot. */
  offset: number;
  /** The run's first row the slot covers: it stays lent while the reservation is at most this. */
  firstRow: number;
}

/** Rows reserved for a sequence whose passes have reached position `end` (exclusive). */
export function reservedRows(end: number): number {
  return Math.ceil(end / GROWTH_ROWS) * GROWTH_ROWS;
}

/**
 * The slots of `pitch` bytes (a multiple of {@link PAGE}) that fit at the tops of `runs` of
 * sequence `seq`, each page-aligned.
 */
export function lendableSlots(runs: readonly RowRun[], pitch: number, seq = 0): LendableSlot[] {
  const out: LendableSlot[] = [];
  for (const r of runs) {
    const top = Math.floor((r.offset + r.rows * r.rowBytes) / PAGE) * PAGE;
    for (let start = top - pitch; start >= r.offset; start -= pitch) {
      out.push({ seq, offset: start, firstRow: Math.floor((start - r.offset) / r.rowBytes) });
    }
  }
  return out;
}

/** Of `slots`, the `n` the context reaches last (deterministic order). */
export function pickLent(slots: readonly LendableSlot[], n: number): LendableSlot[] {
  return [...slots]
    .sort((a, b) => b.firstRow - a.firstRow || a.seq - b.seq || a.offset - b.offset)
    .slice(0, n);
}

/**
 * How many expert slots of `pitch` bytes the unwritten state of `sequences` sequences holds with
 * nothing written: per layer, the runs its state region starts with (offsets from the region's
 * start, as each layer's region starts on a page).
 */
export function lendableCount(
  layerRuns: readonly (readonly { rows: number; rowBytes: number }[])[],
  pitch: number,
  sequences: number,
): number {
  let n = 0;
  for (const runs of layerRuns) {
    let offset = 0;
    const placed = runs.map((r) => {
      const run = { offset, ...r };
      offset += r.rows * r.rowBytes;
      return run;
    });
    n += lendableSlots(placed, pitch).length;
  }
  return n * sequences;
}

/** What the lender takes back from and gives back to (engine/stream/expert_store.ts). */
export interface LendingStore {
  /** Takes a slot out of the cache, waiting for a read landing in it first. */
  reclaim(slot: number): void;
  /** Puts a retired slot back in the cache, empty. */
  restore(slot: number): void;
}

/** Counters of a {@link KvLender}. */
export interface LendingStats {
  /** Slots taken back as contexts grew. */
  reclaimed: number;
  /** Slots given back as sequences started over lower. */
  restored: number;
}

/**
 * Lends cache slots `first`.. (one per entry of `slots`) while their sequences' reservations stay
 * below them. Every slot starts retired; {@link reserve} lends or takes back each one.
 */
export class KvLender {
  readonly stats: LendingStats = { reclaimed: 0, restored: 0 };
  readonly #store: LendingStore;
  readonly #slots: readonly LendableSlot[];
  readonly #first: number;
  /** Per lent slot: whether the cache holds it now. */
  readonly #lent: boolean[];
  /** Per sequence: rows reserved. */
  readonly #reserved = new Map<number, number>();

  constructor(store: LendingStore, slots: readonly LendableSlot[], first: number) {
    this.#store = store;
    this.#slots = slots;
    this.#first = first;
    this.#lent = slots.map(() => false);
  }

  /** Lent slots the cache holds now. */
  get lent(): number {
    return this.#lent.filter((x) => x).length;
  }

  /** Zeroes the counters (after lending at start, so they count the run only). */
  resetStats(): void {
    this.stats.reclaimed = 0;
    this.stats.restored = 0;
  }

  /** Rows reserved for sequence `seq`. */
  reservedOf(seq: number): number {
    return this.#reserved.get(seq) ?? 0;
  }

  /**
   * Reserves sequence `seq`'s rows below position `end` (rounded up to {@link GROWTH_ROWS}),
   * before anything writes them: lent slots the reservation reaches are taken back, and those
   * it no longer reaches (the sequence started over lower) given back.
   */
  reserve(seq: number, end: number): void {
    const rows = reservedRows(end);
    this.#reserved.set(seq, rows);
    this.#slots.forEach((s, i) => {
      if (s.seq !== seq) return;
      const lend = s.firstRow >= rows;
      if (lend === this.#lent[i]) return;
      if (lend) {
        this.#store.restore(this.#first + i);
        this.stats.restored++;
      } else {
        this.#store.reclaim(this.#first + i);
        this.stats.reclaimed++;
      }
      this.#lent[i] = lend;
    });
  }
}

/**
 * The token mixer of a layer (the part that moves information between positions: attention,
 * latent attention, linear attention) as the layer skeleton sees it. Each kind is one file beside
 * this one: its tensors' shapes, the state it keeps per sequence, its scratch, and the engine's
 * implementation; engine/parts/mod.ts lists them and io/model_config.ts `mixerOf` says which one
 * each layer runs. Its float64 reference is engine/reference/mixers.ts's entry of the same name.
 *
 * @module
 */
import type { TensorSpec } from "../../io/manifest.ts";
import type { LayerTensor, MixerName, ModelConfig } from "../../io/model_config.ts";
import type { Arena } from "../arena.ts";
import type { Ops } from "../ops.ts";
import type { LayerWeights } from "../weights.ts";

/** One fixed-size recurrent state in the arena. */
export interface StateRegion {
  offset: number;
  bytes: number;
}

/** One position-indexed cache in the arena: position p's row is at offset + p × rowBytes. */
export interface CacheRegion {
  offset: number;
  rowBytes: number;
  /**
   * Rows it holds, filled from the first up (a ring: position p at row p mod rows), so its rows
   * above the context are unwritten and lent to the expert cache (engine/kv_lending.ts); absent
   * where rows do not follow positions so (nothing is lent).
   */
  rows?: number;
  /**
   * A sliding window's ring: the positions a query reads (p − window + 1 .. p). Once the ring has
   * wrapped, it keeps rows − window + 1 positions to rewind over (see {@link canResumeAt}).
   */
  window?: number;
}

/** Rows of `r` that positions 0..n−1 fill: n, or a ring's rows once it has wrapped. */
export function heldRows(r: CacheRegion, n: number): number {
  return r.rows === undefined ? n : Math.min(n, r.rows);
}

/** Views of the rows that positions 0..n−1 fill in each of `regions`, in order. */
export function regionRows(arena: Arena, regions: readonly CacheRegion[], n: number): Uint8Array[] {
  return regions.map((r) => arena.u8(r.offset, heldRows(r, n) * r.rowBytes));
}

/**
 * Writes back into `regions` what {@link regionRows} took of `stored` positions (one region after
 * another in `bytes`), keeping the first `n` ≤ `stored` positions of each (a wrapped ring whole:
 * the caller checks with {@link canResumeAt} that `n` is within its reach). Returns the bytes read.
 */
export function writeRegionRows(
  arena: Arena,
  regions: readonly CacheRegion[],
  bytes: Uint8Array,
  stored: number,
  n: number,
): number {
  let at = 0;
  for (const r of regions) {
    const held = heldRows(r, stored);
    const rows = held < stored ? held : n;
    arena.u8(r.offset, rows * r.rowBytes).set(bytes.subarray(at, at + rows * r.rowBytes));
    at += held * r.rowBytes;
  }
  return at;
}

/**
 * Whether caches `regions` holding positions 0..had−1 can continue at position `at` ≤ had (the
 * rows from `at` on written again): a ring that has wrapped has overwritten the rows of its
 * oldest positions, so a query at `at` finds those it reads only when had − at ≤ rows − window + 1.
 */
export function canResumeAt(regions: readonly CacheRegion[], had: number, at: number): boolean {
  return regions.every((r) =>
    r.window === undefined || r.rows === undefined || had <= r.rows ||
    had - at <= r.rows - r.window + 1
  );
}

/** A run of `rows` position-indexed rows of `rowBytes` (see {@link CacheRegion.rows}). */
export interface RowShape {
  rows: number;
  rowBytes: number;
}

/** One sequence's rows of a batched mixer call: `n` rows at positions pos.. of sequence `seq`. */
export interface SequenceSpan {
  seq: number;
  n: number;
  pos: number;
}

/** The mixer of the layers that run one kind, with its per-sequence state and scratch. */
export interface Mixer {
  /** out = mixer(h) for `nb` tokens at positions pos..pos+nb−1 of layer `layer`. */
  forward(layer: number, lw: LayerWeights, h: number, out: number, nb: number, pos: number): void;
  /**
   * out = mixer(h) for the rows of several sequences, `spans` one after another in h and out,
   * each on its own sequence's state: the projections run over all rows at once (each weight read
   * once for the batch), attention per sequence. Each row comes out as from {@link forward} of its
   * sequence alone. Optional: without it each sequence's rows run through forward in turn.
   */
  forwardSpans?(
    layer: number,
    lw: LayerWeights,
    h: number,
    out: number,
    spans: readonly SequenceSpan[],
  ): void;
  /**
   * Called once per forward pass before any layer runs: a recurrent state refuses a position it
   * cannot continue from here, before any cache or state changes.
   */
  begin?(pos: number, nb: number): void;
  /** The position-indexed caches of its layers, in layer order: what a saved session holds. */
  cacheRegions(): CacheRegion[];
  /**
   * Recurrent states of its layers, in layer order: fixed-size regions that carry the whole past,
   * saved whole by a saved session. A model with any cannot rewind: a prompt cache reuses it only
   * to its very end.
   */
  stateRegions?(): StateRegion[];
  /** Declares the recurrent states written back into the arena to be at position `pos`. */
  resumeAt?(pos: number): void;
  /**
   * Selects whose state the calls after it use: sequence `seq` of the `sequences` the part was
   * created for (a batched pass runs each sequence's rows on its own state, engine/batch.ts).
   */
  select(seq: number): void;
}

/**
 * What a mixer keeps per sequence (its state regions' offsets, a recurrent state's position):
 * one copy per sequence a batch may hold, made by `make`, of which one is selected.
 */
export class PerSequence<T> {
  readonly #all: T[];
  #current: T;

  constructor(sequences: number, make: (seq: number) => T) {
    this.#all = Array.from({ length: sequences }, (_, s) => make(s));
    this.#current = this.#all[0];
  }

  /** The selected sequence's copy. */
  get current(): T {
    return this.#current;
  }

  /** Sequence `seq`'s copy. */
  of(seq: number): T {
    const c = this.#all[seq];
    if (c === undefined) {
      throw new Error(`sequence ${seq}: the run holds state for ${this.#all.length} sequence(s)`);
    }
    return c;
  }

  /** Selects sequence `seq`'s copy. */
  select(seq: number): void {
    this.#current = this.of(seq);
  }
}

/** The arena name of sequence `seq`'s copy of a state region named `what` (the first keeps it). */
export function stateName(what: string, seq: number): string {
  return seq === 0 ? what : `${what} (sequence ${seq})`;
}

/** One kind of mixer: what the schema, the planner and the forward pass need of it. */
export interface MixerPart {
  readonly name: MixerName;
  /**
   * The shape of its tensor `t` in layer `layer` ([rows, cols] as in PyTorch, [n] for a vector;
   * a full spec where the shape is looser), derived from the config. Anything but a 2-D shape is
   * stored as an f32 vector.
   */
  shape(cfg: ModelConfig, t: LayerTensor, layer: number): number[] | TensorSpec;
  /**
   * Bytes of layer `layer`'s per-sequence state (KV cache, latent rows, recurrent state and conv
   * window) for `ctx` positions and calls of up to `maxBatch` tokens. Each layer's state is one
   * arena region of exactly this size.
   */
  stateBytes(cfg: ModelConfig, layer: number, ctx: number, maxBatch: number): number;
  /**
   * The position-indexed runs layer `layer`'s state region starts with, back to back: the
   * {@link CacheRegion}s with `rows` its mixer reports, as the planner sees them before anything
   * is allocated. Absent: nothing is lent.
   */
  rowRuns?(cfg: ModelConfig, layer: number, ctx: number, maxBatch: number): RowShape[];
  /**
   * Bytes of everything else the mixer of `layers` allocates (scratch for calls of `maxBatch`
   * tokens and `ctx` positions, tables, weights it derives once), each region rounded up to the
   * arena's page as the arena rounds it.
   */
  scratchBytes(cfg: ModelConfig, layers: number[], ctx: number, maxBatch: number): number;
  /**
   * The mixer of `layers`, its scratch and `sequences` copies of its per-sequence state
   * allocated in `arena`.
   */
  create(
    ops: Ops,
    arena: Arena,
    cfg: ModelConfig,
    layers: number[],
    maxBatch: number,
    maxCtx: number,
    sequences: number,
  ): Mixer;
}

/**
 * What the forward passes ask for weights through. The trunk ring and the expert store (engine/stream/)
 * implement these; the forward passes do not know whether a layer is pinned, in a ring slot or
 * was just read from disk.
 *
 * @module
 */
import type { ExpertBank, LayerRun, TensorEntry } from "../io/container.ts";
import { codebookPointer } from "./codebooks.ts";
import { isCodebookDtype } from "../io/format.ts";
import type { LayerTensor } from "../io/model_config.ts";
import type { TensorRef } from "./tensor.ts";

/** The trunk tensors of one layer, bound to arena addresses. */
export interface LayerWeights {
  /** The tensor, or an error naming the layer and tensor when the layer has none. */
  get(t: LayerTensor): TensorRef;
  has(t: LayerTensor): boolean;
}

/** Hands out layers in the cyclic order the forward pass visits them. */
export interface TrunkSource {
  /** Blocks until `layer` is in the arena. */
  acquire(layer: number): LayerWeights;
  /** The forward pass is done with `layer`; its slot may be reused. */
  release(layer: number): void;
}

/** The three matrices of one expert, bound to arena addresses. */
export interface ExpertWeights {
  gate: TensorRef;
  up: TensorRef;
  down: TensorRef;
  /** gpt-oss: arena addresses of each matrix's f32 bias vector. */
  biases?: { gate: number; up: number; down: number };
}

/** Hands out experts; reads the missing ones. */
export interface ExpertSource {
  /** Most experts one hint may name (all of them stay pinned until released). */
  readonly groupSize: number;
  /** The router chose `ids` for `layer`: hold them, and start reading the ones that are missing. */
  hint(layer: number, ids: readonly number[]): void;
  /** Blocks until the expert is in the arena and keeps it there until release. */
  acquire(layer: number, expert: number): ExpertWeights;
  release(layer: number, expert: number): void;
  /** Whether `acquire` of a hinted expert would return without waiting for a read. */
  ready(layer: number, expert: number): boolean;
}

/** A {@link TensorRef} for a manifest tensor entry whose offsets are relative to `base`. */
export function tensorRef(entry: TensorEntry, base: number): TensorRef {
  const rows = entry.shape[0];
  const cols = entry.shape.length > 1 ? entry.shape.slice(1).reduce((a, b) => a * b, 1) : 1;
  const ref: TensorRef = { ptr: base + entry.offset, dtype: entry.dtype, rows, cols };
  if (entry.scale) ref.scale = base + entry.scale.offset;
  if (entry.paddedCols !== undefined) ref.paddedCols = entry.paddedCols;
  return ref;
}

/** Binds a layer run that was read to arena offset `base`. */
export function bindLayer(layer: number, run: LayerRun, base: number): LayerWeights {
  const refs = new Map<string, TensorRef>();
  for (const [name, entry] of Object.entries(run.tensors)) refs.set(name, tensorRef(entry, base));
  return {
    get(t) {
      const r = refs.get(t);
      if (!r) throw new Error(`layer ${layer} has no tensor ${t}`);
      return r;
    },
    has: (t) => refs.has(t),
  };
}

/**
 * Sets `exact` on a matrix of `bank` that multiplies f32 activations exactly (shipped MXFP4 or
 * INT4: the bank's `activations` flag, on matrices in the bank's format).
 */
export function markExact(ref: TensorRef, bank: ExpertBank): void {
  if (bank.activations === "f32" && ref.dtype === bank.format) ref.exact = true;
}

/**
 * Binds an expert record that was read to arena offset `base`; vq3r and vq4p matrices get the arena
 * address of their layer's codebooks (engine/codebooks.ts must have loaded them).
 */
export function bindExpert(bank: ExpertBank, base: number): ExpertWeights {
  const bind = (m: "gate" | "up" | "down"): TensorRef => {
    const ref = tensorRef(bank.matrices[m], base);
    if (isCodebookDtype(ref.dtype)) ref.codebook = codebookPointer(bank, m);
    markExact(ref, bank);
    return ref;
  };
  const ew: ExpertWeights = { gate: bind("gate"), up: bind("up"), down: bind("down") };
  const b = bank.biases;
  if (b) {
    ew.biases = {
      gate: base + b.gate.offset,
      up: base + b.up.offset,
      down: base + b.down.offset,
    };
  }
  return ew;
}

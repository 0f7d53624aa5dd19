/**
 * What a caller can ask of a pack ({@link PackOptions}), what it gets back ({@link PackResult}),
 * and the check that turns the options into the key a resumable pack must match.
 *
 * @module
 */

import type { Manifest } from "../../io/manifest_schema.ts";
import { EXPERT_OPTIONS } from "../../engine/quant/mod.ts";
import type { ProgressMode } from "../progress.ts";

export { EXPERT_OPTIONS } from "../../engine/quant/mod.ts";

/** An `--experts` choice: a key of {@link EXPERT_OPTIONS} (the weight formats' `option`). */
export type ExpertsOption = string;

/** VQ3R / VQ4P codebook training settings of a pack. */
export interface Vq3rPackOptions {
  /** k-means seed (default 1). */
  seed?: number;
  /** 8-weight vectors sampled per (layer, matrix kind) (default 32768). */
  sampleSize?: number;
  /** Lloyd iterations per stage (default 12). */
  iterations?: number;
  /** Experts of a layer whose matrices are sampled, evenly spaced (default 16). */
  trainExperts?: number;
}

/** Options of `packCheckpoint`. */
export interface PackOptions {
  /** Dequantise / convert every weight matrix to this dtype (norms and routers are f32 anyway). */
  convert?: "f32" | "bf16";
  /** Store the routed experts in this format, quantised from the checkpoint's values. */
  experts?: ExpertsOption;
  /** "int8": per-row int8 for the layers' 2-D matmul weights (not embeddings, norms, routers). */
  trunk?: "int8";
  /** Keep the checkpoint's multi-token-prediction layers, for `--spec mtp` (default true). */
  mtp?: boolean;
  /** Codebook training settings (with `experts: "vq3r"` or `"vq4p"`). */
  vq3r?: Vq3rPackOptions;
  /** Replace an existing output. */
  force?: boolean;
  /** Progress display (default "auto"). */
  progress?: ProgressMode;
  /** Largest streaming buffer for one tensor (default 64 MiB). */
  chunkBytes?: number;
  /**
   * Awaited before the globals ("globals") and before each layer are written, once per step that
   * is not already journaled, so a caller can make the source files that step reads complete
   * (`pull` downloads shards here). Source files are reopened after it returns.
   */
  beforeStep?: (step: "globals" | number) => Promise<void>;
  /** Test hook: fail on purpose right after layer k is written and journaled. */
  stopAfterLayer?: number;
  /** Informational lines (default: stderr). */
  log?: (line: string) => void;
}

/** What `packCheckpoint` did. */
export interface PackResult {
  out: string;
  manifest: Manifest;
  /** Layers written by this run. */
  layersPacked: number[];
  /** Layers kept from an interrupted earlier run. */
  layersResumed: number[];
  /** Bytes of trunk.bin plus all expert banks. */
  containerBytes: number;
  seconds: number;
}

/**
 * Rejects unknown `convert` / `experts` / `trunk` values and returns, as JSON, every option that
 * changes the bytes written: an interrupted pack is resumed only under the same key.
 */
export function packOptionKey(opts: PackOptions): string {
  const convert = opts.convert;
  if (convert !== undefined && convert !== "f32" && convert !== "bf16") {
    throw new Error(`--convert must be f32 or bf16, got ${convert}`);
  }
  if (opts.experts !== undefined && !Object.hasOwn(EXPERT_OPTIONS, opts.experts)) {
    throw new Error(
      `--experts must be one of ${Object.keys(EXPERT_OPTIONS).join(", ")}, got ${opts.experts}`,
    );
  }
  if (opts.trunk !== undefined && opts.trunk !== "int8") {
    throw new Error(`--trunk must be int8, got ${opts.trunk}`);
  }
  return JSON.stringify({
    convert: convert ?? null,
    experts: opts.experts ?? null,
    trunk: opts.trunk ?? null,
    vq3r: opts.experts === "vq3r" || opts.experts === "vq4p" ? opts.vq3r ?? {} : null,
    ...(opts.mtp === false ? { mtp: false } : {}),
  });
}

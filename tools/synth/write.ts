/**
 * {@link synthCheckpoint}: writes a whole synthetic Hugging Face checkpoint (config.json,
 * generation_config.json, tokenizer, safetensors shards and their index) into a temp folder and
 * renames it into place.
 *
 * @module
 */

import { replaceDir } from "../replace_dir.ts";
import { existsSync, mkdirSync, rmSync } from "node:fs";
import { basename, join } from "node:path";
import { formatBytes, Progress, type ProgressMode } from "../progress.ts";
import { SYNTH_BOS_ID, SYNTH_EOS_ID, writeSynthTokenizer } from "./tokenizer.ts";
import { type RouterPlan, routerPlans } from "./routing.ts";
import { planShards, writeShards } from "./safetensors.ts";
import { synthShape } from "./shape.ts";
import { synthTensors } from "./tensors.ts";
import type { SynthArch, SynthDims, SynthDtype, SynthOverrides, SynthShape } from "./types.ts";

/** Options of {@link synthCheckpoint}. */
export interface SynthOptions {
  arch: SynthArch;
  /** Output directory. */
  out: string;
  /** Target bytes of tensor data. */
  size: number;
  overrides?: SynthOverrides;
  /** Default bf16. */
  dtype?: SynthDtype;
  /** Default "uniform". */
  routing?: "uniform" | "skewed";
  /** Folder with trace.jsonl (or the file) for skewed routing. */
  trace?: string;
  /** Default 0. */
  seed?: number;
  /** Largest shard (default 4 GiB); a bigger model gets shards and an index. */
  maxShardBytes?: number;
  /** Replace an existing output. */
  force?: boolean;
  /** Progress display (default "auto"). */
  progress?: ProgressMode;
  /** Informational lines (default: stderr). */
  log?: (line: string) => void;
}

/** What {@link synthCheckpoint} wrote. */
export interface SynthResult {
  dir: string;
  /** Bytes of all safetensors files (headers included). */
  totalBytes: number;
  /** The config.json written. */
  config: Record<string, unknown>;
  dims: SynthDims;
  /** Router plan of each MoE layer. */
  routing: Map<number, RouterPlan>;
  seconds: number;
}

const DEFAULT_MAX_SHARD = 4 * 1024 ** 3;

function writeJson(path: string, v: unknown): void {
  Deno.writeTextFileSync(path, JSON.stringify(v, null, 2) + "\n");
}

/** Writes the files of a checkpoint beside its shards: config, generation config, tokenizer. */
export function writeSideFiles(dir: string, shape: SynthShape): void {
  writeJson(join(dir, "config.json"), shape.config);
  writeJson(join(dir, "generation_config.json"), {
    bos_token_id: SYNTH_BOS_ID,
    eos_token_id: SYNTH_EOS_ID,
    do_sample: false,
  });
  writeSynthTokenizer(dir, shape.dims.vocab, shape.dims.maxPositions);
}

/** The `model.safetensors.index.json` of a sharded checkpoint (`weightMap`: tensor → file). */
export function shardIndex(shape: SynthShape, weightMap: Record<string, string>): unknown {
  return {
    metadata: { total_size: shape.dataBytes },
    weight_map: Object.fromEntries(Object.entries(weightMap).sort()),
  };
}

/**
 * Writes a synthetic checkpoint into `opts.out`: everything goes to `<out>.tmp-<pid>` first and is
 * renamed into place at the end. Memory use is one chunk of 4 Mi values, whatever the model size.
 */
export function synthCheckpoint(opts: SynthOptions): Promise<SynthResult> {
  try {
    return Promise.resolve(writeCheckpoint(opts));
  } catch (e) {
    return Promise.reject(e);
  }
}

function writeCheckpoint(opts: SynthOptions): SynthResult {
  const t0 = performance.now();
  const log = opts.log ?? ((s: string) => console.error(s));
  const dtype = opts.dtype ?? "bf16";
  const seed = opts.seed ?? 0;
  if (!Number.isSafeInteger(seed) || seed < 0) throw new Error(`--seed must be an integer >= 0`);
  const maxShard = opts.maxShardBytes ?? DEFAULT_MAX_SHARD;
  if (existsSync(opts.out) && !opts.force) {
    throw new Error(`${opts.out} already exists; pass --force to replace it`);
  }
  const shape = synthShape(opts.arch, opts.size, opts.overrides ?? {}, dtype);
  const d = shape.dims;
  const plans = routerPlans(opts.arch, d, opts.routing ?? "uniform", opts.trace, seed);
  const shards = planShards(synthTensors(opts.arch, d, dtype), maxShard);
  const tmp = `${opts.out}.tmp-${Deno.pid}`;
  rmSync(tmp, { recursive: true, force: true });
  mkdirSync(tmp, { recursive: true });
  try {
    writeSideFiles(tmp, shape);
    const progress = new Progress({
      label: `synth ${basename(opts.out)}`,
      total: shape.dataBytes,
      mode: opts.progress ?? "auto",
    });
    const { totalBytes, weightMap } = writeShards(tmp, shards, seed, plans, progress);
    progress.finish();
    if (shards.length > 1) {
      writeJson(join(tmp, "model.safetensors.index.json"), shardIndex(shape, weightMap));
    }
    replaceDir(tmp, opts.out);
    const seconds = (performance.now() - t0) / 1000;
    log(
      `synth: wrote ${opts.out}: ${opts.arch}, ${d.layers} layers × ${d.experts} experts ` +
        `top-${d.topK}, hidden ${d.hidden}, vocab ${d.vocab}, ${formatBytes(totalBytes)} in ` +
        `${shards.length} file(s), ${seconds.toFixed(1)} s (${
          (totalBytes / 1e6 / seconds).toFixed(0)
        } MB/s)`,
    );
    return { dir: opts.out, totalBytes, config: shape.config, dims: d, routing: plans, seconds };
  } catch (e) {
    rmSync(tmp, { recursive: true, force: true });
    throw e;
  }
}

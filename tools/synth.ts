/**
 * `deno task synth --arch qwen3_moe|deepseek_v3|mixtral|glm4_moe|gpt_oss|kimi_k3|qwen3_5_moe|
 * deepseek_v4|glm5_next|gemma4|minimax_m2 --size 2G --out DIR [options]`: writes a synthetic
 * Hugging Face checkpoint with random weights, laid out like the real ones (config.json,
 * generation_config.json, a byte-level BPE tokenizer, `model.safetensors` or ≤ 4 GiB shards plus
 * `model.safetensors.index.json`). It is for exercising sluice on models of any size without
 * downloading one: the text such a model writes is gibberish.
 *
 * This file is the command line and the public API; the work is done in tools/synth/:
 * - `types.ts`: architectures, sizes ({@link SynthDims}) and tensor descriptions;
 * - `recipes.ts`, `builders.ts`: each architecture's ratios, config.json and tensors;
 * - `shape.ts`: {@link synthShape}, which scales the layer and expert counts to hit the requested
 *   size, narrowing the model only when even a two-layer model would be too big;
 * - `tensors.ts`: {@link synthTensors}, the tensor list in model order;
 * - `values.ts`: seeded value streams (per tensor, independent of chunking, sharding and order).
 *   Linear weights have std 1/sqrt(fan_in), the embedding std 1, norms 1 + 0.05·n;
 * - `routing.ts`: {@link routerPlans}, uniform or trace-shaped expert popularity;
 * - `safetensors.ts`, `write.ts`: {@link synthCheckpoint}, the files and their atomic placement.
 *
 * @module
 */

import { parseArgs } from "node:util";
import { recipeOf } from "./synth/recipes.ts";
import type { SynthArch, SynthDims, SynthDtype, SynthOverrides } from "./synth/types.ts";
import { synthCheckpoint } from "./synth/write.ts";

export {
  SYNTH_ARCHS,
  type SynthArch,
  type SynthDims,
  type SynthDtype,
  type SynthElemType,
  type SynthInit,
  type SynthOverrides,
  type SynthShape,
  type SynthTensor,
} from "./synth/types.ts";
export { synthShape } from "./synth/shape.ts";
export { synthTensors } from "./synth/tensors.ts";
export { type RouterPlan, routerPlans, tracePopularity } from "./synth/routing.ts";
export { synthCheckpoint, type SynthOptions, type SynthResult } from "./synth/write.ts";

/**
 * Parses a size: a number with an optional unit. K, M, G, T (and KiB, MiB, …) are powers of
 * 1024; KB, MB, GB, TB are powers of 1000.
 */
export function parseSize(s: string): number {
  const m = /^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B?)\s*$/i.exec(s);
  if (!m) {
    throw new Error(`size ${JSON.stringify(s)} is not a number with an optional K/M/G/T unit`);
  }
  const exp = m[2] ? "KMGT".indexOf(m[2].toUpperCase()) + 1 : 0;
  const decimal = m[3].toUpperCase() === "B" && exp > 0;
  return Math.round(Number(m[1]) * (decimal ? 1000 : 1024) ** exp);
}

const USAGE =
  `usage: deno task synth --arch qwen3_moe|deepseek_v3|mixtral|glm4_moe|gpt_oss|kimi_k3|qwen3_5_moe
  |deepseek_v4|glm5_next|gemma4|minimax_m2 --size 2G --out DIR
  [--dtype bf16|f32|fp8] [--routing uniform|skewed --trace DIR] [--seed N] [--force] [--quiet]
  [--max-shard SIZE]
  size overrides: --layers --experts --top-k --hidden --expert-inter --dense-inter --heads
  --kv-heads --head-dim --vocab --max-positions --q-lora-rank --kv-lora-rank --rope-dim
  --nope-dim --v-dim --first-dense --n-group --topk-group --shared-experts
  kimi_k3: --latent --kda-heads --kda-head-dim --attn-res-block --mla-every --mxfp4-experts 0|1
  qwen3_5_moe: --gdn-key-heads --gdn-value-heads --gdn-key-dim --gdn-value-dim --full-every
  --shared-inter
  deepseek_v4: --o-groups --o-lora-rank --window --index-heads --index-head-dim --index-topk
  --hash-layers --hc-mult
  glm5_next: --kda-heads --kda-head-dim --mla-every (bf16: FP8 as the release ships it)
  gemma4: --global-head-dim --global-kv-heads --full-every (every Nth layer full, default 6)
  minimax_m2: --rope-dim (rotary_dim); --dtype fp8 (FP8 E4M3 matrices with 128×128 scales)`;

/** CLI flag → size field. */
const FLAG_FIELDS: Record<string, keyof SynthDims> = {
  layers: "layers",
  experts: "experts",
  "top-k": "topK",
  hidden: "hidden",
  "expert-inter": "expertInter",
  "dense-inter": "denseInter",
  heads: "heads",
  "kv-heads": "kvHeads",
  "head-dim": "headDim",
  vocab: "vocab",
  "max-positions": "maxPositions",
  "q-lora-rank": "qLoraRank",
  "kv-lora-rank": "kvLoraRank",
  "rope-dim": "ropeDim",
  "nope-dim": "nopeDim",
  "v-dim": "vDim",
  "first-dense": "firstDense",
  "n-group": "nGroup",
  "topk-group": "topkGroup",
  "shared-experts": "sharedExperts",
  latent: "latent",
  "kda-heads": "kdaHeads",
  "kda-head-dim": "kdaHeadDim",
  "attn-res-block": "attnResBlock",
  "mla-every": "mlaEvery",
  "mxfp4-experts": "mxfp4Experts",
  "gdn-key-heads": "gdnKeyHeads",
  "gdn-value-heads": "gdnValueHeads",
  "gdn-key-dim": "gdnKeyDim",
  "gdn-value-dim": "gdnValueDim",
  "full-every": "fullEvery",
  "shared-inter": "sharedInter",
  "o-groups": "oGroups",
  "o-lora-rank": "oLoraRank",
  window: "window",
  "index-heads": "indexHeads",
  "index-head-dim": "indexHeadDim",
  "index-topk": "indexTopK",
  "hash-layers": "hashLayers",
  "hc-mult": "hcMult",
  "global-head-dim": "globalHeadDim",
  "global-kv-heads": "globalKvHeads",
};

async function main(args: string[]): Promise<number> {
  const sizeFlags = Object.fromEntries(
    Object.keys(FLAG_FIELDS).map((k) => [k, { type: "string" as const }]),
  );
  let v;
  try {
    v = parseArgs({
      args,
      options: {
        arch: { type: "string" },
        size: { type: "string", default: "2G" },
        out: { type: "string" },
        dtype: { type: "string", default: "bf16" },
        routing: { type: "string", default: "uniform" },
        trace: { type: "string" },
        seed: { type: "string", default: "0" },
        "max-shard": { type: "string" },
        force: { type: "boolean" },
        quiet: { type: "boolean" },
        help: { type: "boolean" },
        ...sizeFlags,
      },
    }).values as Record<string, string | boolean | undefined>;
  } catch (e) {
    console.error(`synth: ${(e as Error).message}\n${USAGE}`);
    return 1;
  }
  if (v.help) {
    console.log(USAGE);
    return 0;
  }
  try {
    if (typeof v.arch !== "string" || typeof v.out !== "string") {
      throw new Error("--arch and --out are required");
    }
    const arch = v.arch as SynthArch;
    recipeOf(arch);
    const int = (flag: string, s: string) => {
      if (!/^\d+$/.test(s)) throw new Error(`--${flag} must be a non-negative integer, got ${s}`);
      return Number(s);
    };
    const overrides: SynthOverrides = {};
    for (const [flag, field] of Object.entries(FLAG_FIELDS)) {
      if (typeof v[flag] === "string") overrides[field] = int(flag, v[flag] as string);
    }
    await synthCheckpoint({
      arch,
      out: v.out,
      size: parseSize(v.size as string),
      overrides,
      dtype: v.dtype as SynthDtype,
      routing: v.routing as "uniform" | "skewed",
      trace: v.trace as string | undefined,
      seed: int("seed", v.seed as string),
      maxShardBytes: typeof v["max-shard"] === "string" ? parseSize(v["max-shard"]) : undefined,
      force: Boolean(v.force),
      progress: v.quiet ? "off" : "auto",
      log: v.quiet ? () => {} : undefined,
    });
    return 0;
  } catch (e) {
    console.error(`synth: ${(e as Error).message}`);
    return 1;
  }
}

if (import.meta.main) Deno.exit(await main(Deno.args));

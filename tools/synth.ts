/**
 * `deno task synth --arch qwen3_moe|deepseek_v3|mixtral --size 2G --out DIR [options]`: writes a
 * synthetic Hugging Face checkpoint with random weights, laid out like the real ones (config.json,
 * generation_config.json, a byte-level BPE tokenizer, `model.safetensors` or ≤ 4 GiB shards plus
 * `model.safetensors.index.json`). It is for exercising sluice on models of any size without
 * downloading one: the text such a model writes is gibberish.
 *
 * Shapes follow the real model's ratios (Qwen3-30B-A3B, DeepSeek-V3 at hidden 2048, Mixtral at
 * hidden 1024) and {@link synthShape} scales the layer and expert counts to hit the requested size,
 * narrowing the model only when even a two-layer model would be too big.
 *
 * Values: each tensor has its own xorshift32 stream, seeded from the seed and the tensor's name,
 * so the bytes do not depend on chunking, sharding or order. One 32-bit draw gives one value: the
 * sum of its four bytes (Irwin–Hall, n = 4), standardised, is a bell-shaped variate with 1021
 * levels, mapped through a per-tensor table to `mean + std · n`. Linear weights have std
 * 1/sqrt(fan_in), the embedding std 1, norms 1 + 0.05·n.
 *
 * Routing: see {@link routerPlans}.
 *
 * @module
 */

import { closeSync, existsSync, mkdirSync, openSync, renameSync, rmSync, writeSync } from "node:fs";
import { basename, join } from "node:path";
import { parseArgs } from "node:util";
import { normalizeConfig } from "../engine/config.ts";
import { readTrace, readTraceMeta, traceShape } from "../io/trace.ts";
import { formatBytes, Progress, type ProgressMode } from "./progress.ts";
import { SYNTH_BOS_ID, SYNTH_EOS_ID, writeSynthTokenizer } from "./synth_tokenizer.ts";

/** The architectures {@link synthCheckpoint} can write. */
export const SYNTH_ARCHS = ["qwen3_moe", "deepseek_v3", "mixtral"] as const;

/** One of {@link SYNTH_ARCHS}. */
export type SynthArch = typeof SYNTH_ARCHS[number];

/** Storage dtype of the weights (the DeepSeek selection bias is always F32, as in the real one). */
export type SynthDtype = "bf16" | "f32";

/** Every size of a synthetic model. Fields an architecture has no use for are ignored. */
export interface SynthDims {
  hidden: number;
  layers: number;
  experts: number;
  topK: number;
  /** Rows of one routed expert's gate/up. */
  expertInter: number;
  /** Rows of a dense MLP's gate/up (DeepSeek's first layers; written to Qwen3's config only). */
  denseInter: number;
  heads: number;
  kvHeads: number;
  headDim: number;
  vocab: number;
  maxPositions: number;
  qLoraRank: number;
  kvLoraRank: number;
  ropeDim: number;
  nopeDim: number;
  vDim: number;
  /** DeepSeek: number of leading dense layers. */
  firstDense: number;
  nGroup: number;
  topkGroup: number;
  sharedExperts: number;
}

/** Sizes fixed by the caller; the solver chooses the rest. */
export type SynthOverrides = Partial<SynthDims>;

/** How one tensor's values are drawn. */
type Init =
  | { kind: "normal"; mean: number; std: number }
  /** A router: normal rows with std 1/sqrt(hidden), each times its row scale. */
  | { kind: "router" }
  | { kind: "zeros" };

/** One tensor of the checkpoint. */
export interface SynthTensor {
  name: string;
  shape: number[];
  dtype: "BF16" | "F32";
  init: Init;
  /** Layer it belongs to, or -1 for the embedding, final norm and lm_head. */
  layer: number;
}

/** What {@link synthShape} chose. */
export interface SynthShape {
  arch: SynthArch;
  dims: SynthDims;
  /** The Hugging Face config.json. */
  config: Record<string, unknown>;
  /** Bytes of tensor data (safetensors headers excluded). */
  dataBytes: number;
}

/** Per-architecture recipe: real-model ratios as functions of the hidden size. */
interface Recipe {
  baseHidden: number;
  baseLayers: number;
  baseExperts: number;
  baseTopK: number;
  /** Expert counts the solver tries are multiples of this, up to maxExperts. */
  expertStep: number;
  maxExperts: number;
  maxPositions: number;
  /** Sizes that follow from the hidden size. */
  width(h: number): Partial<SynthDims>;
  /** Sizes that follow from the layer and expert counts. */
  counts(d: SynthDims): Partial<SynthDims>;
  config(d: SynthDims, dtype: SynthDtype): Record<string, unknown>;
  /** Tensors of layer `l` other than the routed experts. */
  layer(d: SynthDims, l: number, dt: "BF16" | "F32"): SynthTensor[];
  /** Tensors of one routed expert. */
  expert(d: SynthDims, l: number, e: number, dt: "BF16" | "F32"): SynthTensor[];
  isMoe(d: SynthDims, l: number): boolean;
  minLayers(d: SynthDims): number;
}

const clamp = (x: number, lo: number, hi: number) => Math.min(hi, Math.max(lo, x));

function linear(name: string, out: number, inp: number, dt: "BF16" | "F32", l: number) {
  return {
    name,
    shape: [out, inp],
    dtype: dt,
    init: { kind: "normal", mean: 0, std: 1 / Math.sqrt(inp) },
    layer: l,
  } as SynthTensor;
}

function norm(name: string, n: number, dt: "BF16" | "F32", l: number): SynthTensor {
  return { name, shape: [n], dtype: dt, init: { kind: "normal", mean: 1, std: 0.05 }, layer: l };
}

/** Router rows ∝ 1/sqrt(hidden) give logits of about unit spread on RMS-normalised inputs. */
function router(name: string, experts: number, h: number, dt: "BF16" | "F32", l: number) {
  return {
    name,
    shape: [experts, h],
    dtype: dt,
    init: { kind: "router" },
    layer: l,
  } as SynthTensor;
}

/** About `q` query heads sharing each kv head among `ratio`, with kv heads dividing q heads. */
function gqaHeads(q: number, ratio: number): { heads: number; kvHeads: number } {
  const kvHeads = Math.max(1, Math.round(q / ratio));
  return { heads: kvHeads * Math.max(1, Math.round(q / kvHeads)), kvHeads };
}

/** Top-k that keeps at least one eighth of the experts active, up to the real model's k. */
function defaultTopK(experts: number, baseTopK: number): number {
  return Math.min(baseTopK, experts, Math.max(2, Math.floor(experts / 8)));
}

function gqaAttention(d: SynthDims, l: number, dt: "BF16" | "F32"): SynthTensor[] {
  const p = `model.layers.${l}.`;
  const q = d.heads * d.headDim, kv = d.kvHeads * d.headDim;
  return [
    norm(p + "input_layernorm.weight", d.hidden, dt, l),
    norm(p + "post_attention_layernorm.weight", d.hidden, dt, l),
    linear(p + "self_attn.q_proj.weight", q, d.hidden, dt, l),
    linear(p + "self_attn.k_proj.weight", kv, d.hidden, dt, l),
    linear(p + "self_attn.v_proj.weight", kv, d.hidden, dt, l),
    linear(p + "self_attn.o_proj.weight", d.hidden, q, dt, l),
  ];
}

function glu(
  prefix: string,
  names: [string, string, string],
  inter: number,
  h: number,
  dt: "BF16" | "F32",
  l: number,
) {
  return [
    linear(prefix + names[0] + ".weight", inter, h, dt, l),
    linear(prefix + names[1] + ".weight", inter, h, dt, l),
    linear(prefix + names[2] + ".weight", h, inter, dt, l),
  ];
}

const PROJ: [string, string, string] = ["gate_proj", "up_proj", "down_proj"];

const QWEN3_MOE: Recipe = {
  baseHidden: 2048,
  baseLayers: 48,
  baseExperts: 128,
  baseTopK: 8,
  expertStep: 8,
  maxExperts: 512,
  maxPositions: 40960,
  width: (h) => {
    const headDim = Math.round(clamp(h / 16, 16, 128));
    return {
      headDim,
      ...gqaHeads((2 * h) / headDim, 8),
      expertInter: (3 * h) / 8,
      denseInter: 3 * h,
    };
  },
  counts: (d) => ({ topK: defaultTopK(d.experts, 8) }),
  config: (d, dtype) => ({
    architectures: ["Qwen3MoeForCausalLM"],
    model_type: "qwen3_moe",
    vocab_size: d.vocab,
    hidden_size: d.hidden,
    intermediate_size: d.denseInter,
    moe_intermediate_size: d.expertInter,
    num_hidden_layers: d.layers,
    num_attention_heads: d.heads,
    num_key_value_heads: d.kvHeads,
    head_dim: d.headDim,
    hidden_act: "silu",
    max_position_embeddings: d.maxPositions,
    rms_norm_eps: 1e-6,
    rope_theta: 1e6,
    rope_scaling: null,
    attention_bias: false,
    attention_dropout: 0,
    use_sliding_window: false,
    sliding_window: null,
    max_window_layers: d.layers,
    decoder_sparse_step: 1,
    mlp_only_layers: [],
    num_experts: d.experts,
    num_experts_per_tok: d.topK,
    norm_topk_prob: true,
    output_router_logits: false,
    router_aux_loss_coef: 0.001,
    initializer_range: 0.02,
    tie_word_embeddings: false,
    bos_token_id: SYNTH_BOS_ID,
    eos_token_id: SYNTH_EOS_ID,
    use_cache: true,
    torch_dtype: dtype === "bf16" ? "bfloat16" : "float32",
  }),
  layer: (d, l, dt) => [
    ...gqaAttention(d, l, dt),
    norm(`model.layers.${l}.self_attn.q_norm.weight`, d.headDim, dt, l),
    norm(`model.layers.${l}.self_attn.k_norm.weight`, d.headDim, dt, l),
    router(`model.layers.${l}.mlp.gate.weight`, d.experts, d.hidden, dt, l),
  ],
  expert: (d, l, e, dt) =>
    glu(`model.layers.${l}.mlp.experts.${e}.`, PROJ, d.expertInter, d.hidden, dt, l),
  isMoe: () => true,
  minLayers: () => 2,
};

const MIXTRAL: Recipe = {
  baseHidden: 1024,
  baseLayers: 32,
  baseExperts: 8,
  baseTopK: 2,
  expertStep: 8,
  maxExperts: 64,
  maxPositions: 32768,
  width: (h) => {
    const headDim = Math.round(clamp(h / 8, 16, 128));
    return { headDim, ...gqaHeads(h / headDim, 4), expertInter: (7 * h) / 2 };
  },
  counts: (d) => ({ topK: Math.min(2, d.experts) }),
  config: (d, dtype) => ({
    architectures: ["MixtralForCausalLM"],
    model_type: "mixtral",
    vocab_size: d.vocab,
    hidden_size: d.hidden,
    intermediate_size: d.expertInter,
    num_hidden_layers: d.layers,
    num_attention_heads: d.heads,
    num_key_value_heads: d.kvHeads,
    head_dim: d.headDim,
    hidden_act: "silu",
    max_position_embeddings: d.maxPositions,
    rms_norm_eps: 1e-5,
    rope_theta: 1e6,
    sliding_window: null,
    attention_dropout: 0,
    num_local_experts: d.experts,
    num_experts_per_tok: d.topK,
    router_aux_loss_coef: 0.02,
    router_jitter_noise: 0,
    output_router_logits: false,
    initializer_range: 0.02,
    tie_word_embeddings: false,
    bos_token_id: SYNTH_BOS_ID,
    eos_token_id: SYNTH_EOS_ID,
    use_cache: true,
    torch_dtype: dtype === "bf16" ? "bfloat16" : "float32",
  }),
  layer: (d, l, dt) => [
    ...gqaAttention(d, l, dt),
    router(`model.layers.${l}.block_sparse_moe.gate.weight`, d.experts, d.hidden, dt, l),
  ],
  expert: (d, l, e, dt) =>
    glu(
      `model.layers.${l}.block_sparse_moe.experts.${e}.`,
      ["w1", "w3", "w2"],
      d.expertInter,
      d.hidden,
      dt,
      l,
    ),
  isMoe: () => true,
  minLayers: () => 2,
};

const DEEPSEEK_V3: Recipe = {
  baseHidden: 2048,
  baseLayers: 61,
  baseExperts: 256,
  baseTopK: 8,
  expertStep: 8,
  maxExperts: 512,
  maxPositions: 163840,
  width: (h) => {
    const ropeDim = 2 * Math.round(clamp(h / 64, 4, 32));
    const expertInter = (3 * h) / 8;
    return {
      heads: Math.max(1, h / 128),
      qLoraRank: (3 * h) / 8,
      kvLoraRank: Math.min(512, h / 4),
      ropeDim,
      nopeDim: 2 * ropeDim,
      vDim: 2 * ropeDim,
      expertInter,
      // DeepSeek-V3: dense 18432 = 9 × expert 2048.
      denseInter: 9 * expertInter,
      sharedExperts: 1,
    };
  },
  counts: (d) => {
    // Groups of at least 4 experts, at most 8 groups, half of them kept (V3: 8 groups, 4 kept).
    let nGroup = 8;
    while (nGroup > 1 && (d.experts % nGroup || d.experts / nGroup < 4)) nGroup /= 2;
    return {
      topK: defaultTopK(d.experts, 8),
      // V3 keeps its first 3 of 61 layers dense.
      firstDense: clamp(Math.round((d.layers * 3) / 61), 1, 3),
      nGroup,
      topkGroup: Math.max(1, nGroup / 2),
    };
  },
  config: (d, dtype) => ({
    architectures: ["DeepseekV3ForCausalLM"],
    model_type: "deepseek_v3",
    vocab_size: d.vocab,
    hidden_size: d.hidden,
    intermediate_size: d.denseInter,
    moe_intermediate_size: d.expertInter,
    num_hidden_layers: d.layers,
    first_k_dense_replace: d.firstDense,
    moe_layer_freq: 1,
    n_routed_experts: d.experts,
    num_experts_per_tok: d.topK,
    n_group: d.nGroup,
    topk_group: d.topkGroup,
    n_shared_experts: d.sharedExperts,
    scoring_func: "sigmoid",
    topk_method: "noaux_tc",
    norm_topk_prob: true,
    routed_scaling_factor: 2.5,
    num_attention_heads: d.heads,
    num_key_value_heads: d.heads,
    q_lora_rank: d.qLoraRank,
    kv_lora_rank: d.kvLoraRank,
    qk_nope_head_dim: d.nopeDim,
    qk_rope_head_dim: d.ropeDim,
    v_head_dim: d.vDim,
    hidden_act: "silu",
    max_position_embeddings: d.maxPositions,
    rope_theta: 10000,
    rope_scaling: {
      type: "yarn",
      factor: 40,
      original_max_position_embeddings: 4096,
      beta_fast: 32,
      beta_slow: 1,
      mscale: 1,
      mscale_all_dim: 1,
    },
    rms_norm_eps: 1e-6,
    attention_bias: false,
    attention_dropout: 0,
    tie_word_embeddings: false,
    num_nextn_predict_layers: 0,
    ep_size: 1,
    initializer_range: 0.02,
    bos_token_id: SYNTH_BOS_ID,
    eos_token_id: SYNTH_EOS_ID,
    pad_token_id: null,
    use_cache: true,
    torch_dtype: dtype === "bf16" ? "bfloat16" : "float32",
  }),
  layer: (d, l, dt) => {
    const p = `model.layers.${l}.`;
    const out: SynthTensor[] = [
      norm(p + "input_layernorm.weight", d.hidden, dt, l),
      norm(p + "post_attention_layernorm.weight", d.hidden, dt, l),
      linear(p + "self_attn.q_a_proj.weight", d.qLoraRank, d.hidden, dt, l),
      norm(p + "self_attn.q_a_layernorm.weight", d.qLoraRank, dt, l),
      linear(
        p + "self_attn.q_b_proj.weight",
        d.heads * (d.nopeDim + d.ropeDim),
        d.qLoraRank,
        dt,
        l,
      ),
      linear(p + "self_attn.kv_a_proj_with_mqa.weight", d.kvLoraRank + d.ropeDim, d.hidden, dt, l),
      norm(p + "self_attn.kv_a_layernorm.weight", d.kvLoraRank, dt, l),
      linear(p + "self_attn.kv_b_proj.weight", d.heads * (d.nopeDim + d.vDim), d.kvLoraRank, dt, l),
      linear(p + "self_attn.o_proj.weight", d.hidden, d.heads * d.vDim, dt, l),
    ];
    if (l < d.firstDense) return [...out, ...glu(p + "mlp.", PROJ, d.denseInter, d.hidden, dt, l)];
    return [
      ...out,
      router(p + "mlp.gate.weight", d.experts, d.hidden, dt, l),
      {
        name: p + "mlp.gate.e_score_correction_bias",
        shape: [d.experts],
        dtype: "F32",
        init: { kind: "zeros" },
        layer: l,
      },
      ...glu(p + "mlp.shared_experts.", PROJ, d.expertInter * d.sharedExperts, d.hidden, dt, l),
    ];
  },
  expert: (d, l, e, dt) =>
    glu(`model.layers.${l}.mlp.experts.${e}.`, PROJ, d.expertInter, d.hidden, dt, l),
  isMoe: (d, l) => l >= d.firstDense,
  minLayers: (d) => d.firstDense + 1,
};

const RECIPES: Record<SynthArch, Recipe> = {
  qwen3_moe: QWEN3_MOE,
  deepseek_v3: DEEPSEEK_V3,
  mixtral: MIXTRAL,
};

function recipeOf(arch: string): Recipe {
  if (!Object.hasOwn(RECIPES, arch)) {
    throw new Error(`unknown architecture ${arch}; choose one of ${SYNTH_ARCHS.join(", ")}`);
  }
  return RECIPES[arch as SynthArch];
}

function dtypeName(dtype: SynthDtype): "BF16" | "F32" {
  if (dtype !== "bf16" && dtype !== "f32") {
    throw new Error(`--dtype must be bf16 or f32, got ${dtype}`);
  }
  return dtype === "bf16" ? "BF16" : "F32";
}

function tensorBytes(t: SynthTensor): number {
  return t.shape.reduce((a, b) => a * b, 1) * (t.dtype === "BF16" ? 2 : 4);
}

const sumBytes = (ts: SynthTensor[]) => ts.reduce((n, t) => n + tensorBytes(t), 0);

function globalTensors(d: SynthDims, dt: "BF16" | "F32") {
  return {
    head: [{
      name: "model.embed_tokens.weight",
      shape: [d.vocab, d.hidden],
      dtype: dt,
      init: { kind: "normal", mean: 0, std: 1 },
      layer: -1,
    } as SynthTensor],
    tail: [
      norm("model.norm.weight", d.hidden, dt, -1),
      linear("lm_head.weight", d.vocab, d.hidden, dt, -1),
    ],
  };
}

/** Every tensor of the model, in model order (embedding, layers in order, final norm, lm_head). */
export function synthTensors(arch: SynthArch, d: SynthDims, dtype: SynthDtype): SynthTensor[] {
  const r = recipeOf(arch), dt = dtypeName(dtype);
  const g = globalTensors(d, dt);
  const out = [...g.head];
  for (let l = 0; l < d.layers; l++) {
    out.push(...r.layer(d, l, dt));
    if (r.isMoe(d, l)) { for (let e = 0; e < d.experts; e++) out.push(...r.expert(d, l, e, dt)); }
  }
  return [...out, ...g.tail];
}

/** Bytes of tensor data of a model, without listing every expert. */
function modelBytes(r: Recipe, d: SynthDims, dt: "BF16" | "F32"): number {
  const g = globalTensors(d, dt);
  let n = sumBytes(g.head) + sumBytes(g.tail);
  const expert = sumBytes(r.expert(d, 0, 0, dt));
  // Layers of one kind have the same tensors, so each kind is measured once.
  const perKind = new Map<boolean, number>();
  for (let l = 0; l < d.layers; l++) {
    const moe = r.isMoe(d, l);
    if (!perKind.has(moe)) {
      perKind.set(moe, sumBytes(r.layer(d, l, dt)) + (moe ? d.experts * expert : 0));
    }
    n += perKind.get(moe)!;
  }
  return n;
}

/** Applies the defaults that follow from the counts, then the caller's overrides again. */
function complete(r: Recipe, base: SynthDims, o: SynthOverrides): SynthDims {
  const d = { ...base, ...o };
  return { ...d, ...r.counts(d), ...o };
}

/** Largest vocabulary (≤ 32000) whose embedding and lm_head take at most a tenth of the budget. */
function defaultVocab(hidden: number, bytes: number, elemBytes: number): number {
  for (const v of [32000, 16384, 8192, 4096, 2048, 1024]) {
    if (2 * v * hidden * elemBytes <= bytes / 10) return v;
  }
  return 512;
}

const OVERRIDE_KEYS: readonly (keyof SynthDims)[] = [
  "hidden",
  "layers",
  "experts",
  "topK",
  "expertInter",
  "denseInter",
  "heads",
  "kvHeads",
  "headDim",
  "vocab",
  "maxPositions",
  "qLoraRank",
  "kvLoraRank",
  "ropeDim",
  "nopeDim",
  "vDim",
  "firstDense",
  "nGroup",
  "topkGroup",
  "sharedExperts",
];

function checkOverrides(o: SynthOverrides): void {
  for (const [k, v] of Object.entries(o)) {
    if (v === undefined) continue;
    if (!OVERRIDE_KEYS.includes(k as keyof SynthDims)) {
      throw new Error(`unknown size override ${k}`);
    }
    const min = k === "firstDense" || k === "sharedExperts" ? 0 : 1;
    if (!Number.isSafeInteger(v) || v < min) {
      throw new Error(`size override ${k} must be an integer >= ${min}, got ${v}`);
    }
  }
}

/** A shape the solver considered. */
interface Candidate {
  d: SynthDims;
  bytes: number;
  /** |ln(bytes / target)| */
  err: number;
  /** |ln| of the layers/experts ratio over the real model's. */
  aspect: number;
  cost: number;
}

/** How far (in ln) the solver may miss the target size before it counts as a miss. */
const SIZE_TOLERANCE = 0.05;
/** Layers/experts ratio within 4× of the real model's counts as realistic. */
const MAX_ASPECT = Math.log(4);

/**
 * Chooses the sizes of a model of about `bytes` bytes of tensor data. Overridden sizes are kept.
 * At the architecture's base width, the layer and expert counts are chosen together: among the
 * candidates within 5% of the target, the one whose layers/experts ratio is closest to the real
 * model's (in log scale). When no candidate comes within 5% with a ratio within 4× of the real
 * one, the width is halved (down to 64) and the search repeated; the fallback is the best
 * candidate over all widths.
 */
export function synthShape(
  arch: SynthArch,
  bytes: number,
  overrides: SynthOverrides = {},
  dtype: SynthDtype = "bf16",
): SynthShape {
  const r = recipeOf(arch), dt = dtypeName(dtype);
  if (!(bytes > 0)) throw new Error(`target size must be positive, got ${bytes}`);
  checkOverrides(overrides);
  const widths: number[] = [];
  if (overrides.hidden) widths.push(overrides.hidden);
  else for (let h = r.baseHidden; h >= 64; h /= 2) widths.push(h);
  let best: Candidate | null = null;
  for (const h of widths) {
    const atWidth = searchCounts(r, h, bytes, overrides, dt);
    if (!atWidth) continue;
    if (!best || atWidth.cost < best.cost) best = atWidth;
    if (atWidth.err <= SIZE_TOLERANCE && atWidth.aspect <= MAX_ASPECT) break;
  }
  // Too big for the largest counts at the base width: try wider models.
  for (let h = 2 * r.baseHidden; !overrides.hidden && best && best.bytes * 1.05 < bytes; h *= 2) {
    if (h > 8 * r.baseHidden) break;
    const atWidth = searchCounts(r, h, bytes, overrides, dt);
    if (atWidth && atWidth.cost < best.cost) best = atWidth;
  }
  if (!best) throw new Error(`no ${arch} shape found for ${bytes} bytes`);
  const config = recipeOf(arch).config(best.d, dtype);
  // The engine's own normaliser is the judge of whether the config is consistent.
  normalizeConfig(config, undefined, `synthetic ${arch} config`);
  return { arch, dims: best.d, config, dataBytes: best.bytes };
}

/** The best layer and expert counts at hidden size `h`. */
function searchCounts(
  r: Recipe,
  h: number,
  bytes: number,
  overrides: SynthOverrides,
  dt: "BF16" | "F32",
): Candidate | null {
  const base = {
    hidden: h,
    layers: r.baseLayers,
    experts: r.baseExperts,
    topK: r.baseTopK,
    vocab: defaultVocab(h, bytes, dt === "BF16" ? 2 : 4),
    maxPositions: r.maxPositions,
    // Widths that are not powers of two can give fractions; sizes are whole numbers.
    ...Object.fromEntries(
      Object.entries(r.width(h)).map(([k, v]) => [k, Math.max(1, Math.round(v))]),
    ),
  } as SynthDims;
  const minL = r.minLayers(complete(r, base, { ...overrides, layers: 1 }));
  const ls = overrides.layers ? [overrides.layers] : range(minL, 4 * r.baseLayers, 1);
  const es = overrides.experts
    ? [overrides.experts]
    : range(r.expertStep, r.maxExperts, r.expertStep);
  let best: Candidate | null = null;
  for (const e of es) {
    for (const l of ls) {
      const d = complete(r, base, { ...overrides, layers: l, experts: e });
      const n = modelBytes(r, d, dt);
      const err = Math.abs(Math.log(n / bytes));
      const aspect = Math.abs(Math.log((l / r.baseLayers) / (e / r.baseExperts)));
      const cost = Math.max(err - SIZE_TOLERANCE, 0) * 1000 + aspect + err;
      if (!best || cost < best.cost) best = { d, bytes: n, err, aspect, cost };
      if (n > bytes * 1.5) break;
    }
  }
  return best;
}

function range(from: number, to: number, step: number): number[] {
  const out: number[] = [];
  for (let x = from; x <= to; x += step) out.push(x);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Random values

/** FNV-1a of the seed and a name: the start state of that tensor's stream (never 0). */
function streamSeed(seed: number, name: string): number {
  let h = 0x811c9dc5 ^ (seed >>> 0);
  h = Math.imul(h, 0x01000193);
  h ^= Math.floor(seed / 0x100000000) >>> 0;
  for (let i = 0; i < name.length; i++) {
    h ^= name.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return h | 0 || 0x1234567;
}

/** Standard deviation of the sum of four uniform bytes. */
const IRWIN_HALL_STD = Math.sqrt((4 * (256 * 256 - 1)) / 12);

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** float32 → bf16 bits, rounding to nearest even. */
function bf16Bits(x: number): number {
  f32[0] = x;
  const u = u32[0];
  return ((u + 0x7fff + ((u >>> 16) & 1)) >>> 16) & 0xffff;
}

/** The 1021 encoded values `mean + std · n(s)` for byte sums s = 0..1020. */
function valueTable(mean: number, std: number, dt: "BF16" | "F32"): Uint16Array | Float32Array {
  const t = dt === "BF16" ? new Uint16Array(1021) : new Float32Array(1021);
  for (let s = 0; s <= 1020; s++) {
    const v = mean + (std * (s - 510)) / IRWIN_HALL_STD;
    t[s] = dt === "BF16" ? bf16Bits(v) : v;
  }
  return t;
}

/** Fills `dst` from the stream in state `x` through `table`; returns the new state. */
function fillFrom(dst: Uint16Array | Float32Array, table: Uint16Array | Float32Array, x: number) {
  const n = dst.length;
  for (let i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    const y = Math.imul(x, 0x9e3779b1);
    dst[i] = table[(y & 255) + ((y >>> 8) & 255) + ((y >>> 16) & 255) + (y >>> 24)];
  }
  return x;
}

/** A small seeded generator for the routing simulation and permutations. */
class Rng {
  #x: number;
  constructor(seed: number, name: string) {
    this.#x = streamSeed(seed, name);
  }
  /** Uniform in (0, 1). */
  next(): number {
    let x = this.#x;
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    this.#x = x;
    return ((Math.imul(x, 0x9e3779b1) >>> 0) + 0.5) / 4294967296;
  }
  normal(): number {
    return Math.sqrt(-2 * Math.log(this.next())) * Math.cos(2 * Math.PI * this.next());
  }
}

// ---------------------------------------------------------------------------------------------
// Routing

/** The router rows of one MoE layer. */
export interface RouterPlan {
  /** Multiplier of each expert's router row. */
  scales: number[];
  /** Fraction of tokens meant to choose each expert (sums to top-k). */
  target: number[];
}

/** Expert choice as the architecture does it, on a vector of router logits. */
type Selector = (logits: Float64Array, chosen: Uint8Array) => void;

/** Indices of the k largest values of `v` among those with `allowed[i]`. */
function topIndices(v: Float64Array, k: number, allowed?: Uint8Array): number[] {
  const out: number[] = [];
  for (let j = 0; j < k; j++) {
    let bi = -1;
    for (let i = 0; i < v.length; i++) {
      if ((allowed && !allowed[i]) || out.includes(i)) continue;
      if (bi < 0 || v[i] > v[bi]) bi = i;
    }
    out.push(bi);
  }
  return out;
}

function selectorFor(arch: SynthArch, d: SynthDims): Selector {
  if (arch !== "deepseek_v3") {
    // Softmax is monotonic: the top-k probabilities are the top-k logits.
    return (logits, chosen) => {
      for (const i of topIndices(logits, d.topK)) chosen[i] = 1;
    };
  }
  const size = d.experts / d.nGroup;
  if (size < 2) {
    throw new Error(`deepseek_v3: ${d.experts} experts in ${d.nGroup} groups leaves < 2 per group`);
  }
  const scores = new Float64Array(d.experts);
  const groupScore = new Float64Array(d.nGroup);
  const allowed = new Uint8Array(d.experts);
  return (logits, chosen) => {
    // noaux_tc with a zero bias: sigmoid scores, best groups by their top-2 sum, then top-k.
    for (let i = 0; i < d.experts; i++) scores[i] = 1 / (1 + Math.exp(-logits[i]));
    for (let g = 0; g < d.nGroup; g++) {
      const [a, b] = topIndices(scores.subarray(g * size, (g + 1) * size), 2);
      groupScore[g] = scores[g * size + a] + scores[g * size + b];
    }
    allowed.fill(0);
    for (const g of topIndices(groupScore, d.topkGroup)) allowed.fill(1, g * size, (g + 1) * size);
    for (const i of topIndices(scores, d.topK, allowed)) chosen[i] = 1;
  };
}

/** Selection frequency of each expert when the logits are `scales[e] · z_e`, z ~ N(0, 1). */
function simulate(z: Float64Array, scales: number[], select: Selector): number[] {
  const e = scales.length, n = z.length / e;
  const counts = new Array(e).fill(0);
  const logits = new Float64Array(e), chosen = new Uint8Array(e);
  for (let s = 0; s < n; s++) {
    for (let i = 0; i < e; i++) logits[i] = scales[i] * z[s * e + i];
    chosen.fill(0);
    select(logits, chosen);
    for (let i = 0; i < e; i++) counts[i] += chosen[i];
  }
  return counts.map((c) => c / n);
}

/** Per-layer relative popularity (count / mean count, sorted descending) of a routing trace. */
export function tracePopularity(tracePath: string): number[][] {
  const path = tracePath.endsWith(".jsonl") ? tracePath : join(tracePath, "trace.jsonl");
  const events = readTrace(path);
  const shape = traceShape(events, readTraceMeta(path));
  const counts = Array.from({ length: shape.nLayers }, () => new Array(shape.nExperts).fill(0));
  for (const ev of events) for (const x of ev.experts) counts[ev.layer][x]++;
  return counts.map((c, l) => {
    const mean = c.reduce((a, b) => a + b, 0) / c.length;
    if (mean === 0) throw new Error(`${path}: trace layer ${l} has no routing events`);
    return c.map((x) => x / mean).sort((a, b) => b - a);
  });
}

/** Resamples a descending curve to `n` points (by quantile, linear interpolation). */
function resample(curve: number[], n: number): number[] {
  return Array.from({ length: n }, (_, r) => {
    const pos = clamp(((r + 0.5) / n) * curve.length - 0.5, 0, curve.length - 1);
    const i = Math.floor(pos), f = pos - i;
    return curve[i] * (1 - f) + (curve[Math.min(i + 1, curve.length - 1)] ?? curve[i]) * f;
  });
}

/**
 * Router plans of the MoE layers. "uniform": every row scale 1, so random routers pick experts
 * about equally often. "skewed": synthetic MoE layer m takes the popularity curve of trace layer
 * ⌊m·T/M⌋ (expert counts sorted, resampled to this model's expert count by quantile, scaled to sum
 * to top-k, capped at 0.45), assigns the ranks to experts in a seeded random order, and scales
 * each expert's router row by s_e. Scaling a row widens the spread of that expert's logit, so it
 * wins the top-k more often. The s_e are fitted by simulation: logits s_e·z_e with z ~ N(0, 1)
 * i.i.d. (what random rows give on RMS-normalised hidden states), the architecture's selection
 * rule (softmax top-k, or DeepSeek's grouped sigmoid with a zero bias), 2000 samples, 30
 * multiplicative updates s_e ← s_e·(target/observed)^0.5. Since a row scale can at most make an
 * expert win whenever its logit is positive, popularities above about one half cannot be reached.
 */
export function routerPlans(
  arch: SynthArch,
  d: SynthDims,
  routing: "uniform" | "skewed",
  trace: string | undefined,
  seed: number,
): Map<number, RouterPlan> {
  const r = recipeOf(arch);
  const moeLayers = range(0, d.layers - 1, 1).filter((l) => r.isMoe(d, l));
  const plans = new Map<number, RouterPlan>();
  if (routing === "uniform") {
    for (const l of moeLayers) {
      plans.set(l, {
        scales: new Array(d.experts).fill(1),
        target: new Array(d.experts).fill(d.topK / d.experts),
      });
    }
    return plans;
  }
  if (routing !== "skewed") throw new Error(`--routing must be uniform or skewed, got ${routing}`);
  if (!trace) throw new Error("--routing skewed needs --trace DIR (a folder with trace.jsonl)");
  const curves = tracePopularity(trace);
  const select = selectorFor(arch, d);
  const samples = 2000;
  moeLayers.forEach((l, m) => {
    const curve = resample(curves[Math.floor((m * curves.length) / moeLayers.length)], d.experts);
    let f = curve.map((x) => (x * d.topK) / d.experts);
    for (let i = 0; i < 4; i++) {
      f = f.map((x) => Math.min(x, 0.45));
      const sum = f.reduce((a, b) => a + b, 0);
      f = f.map((x) => (x * d.topK) / sum);
    }
    const rng = new Rng(seed, `routing.${l}`);
    const order = range(0, d.experts - 1, 1);
    for (let i = order.length - 1; i > 0; i--) {
      const j = Math.floor(rng.next() * (i + 1));
      [order[i], order[j]] = [order[j], order[i]];
    }
    const target = new Array(d.experts);
    order.forEach((e, rank) => target[e] = f[rank]);
    const z = new Float64Array(samples * d.experts);
    for (let i = 0; i < z.length; i++) z[i] = rng.normal();
    let scales = new Array(d.experts).fill(1);
    for (let it = 0; it < 30; it++) {
      const seen = simulate(z, scales, select);
      scales = scales.map((s, e) => s * Math.sqrt(target[e] / Math.max(seen[e], 0.5 / samples)));
      const logMean = scales.reduce((a, s) => a + Math.log(s), 0) / scales.length;
      scales = scales.map((s) => s / Math.exp(logMean));
    }
    plans.set(l, { scales, target });
  });
  return plans;
}

// ---------------------------------------------------------------------------------------------
// Writing

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
const CHUNK_ELEMS = 1 << 22;

/** Groups tensors (in model order) into shards of at most `max` bytes each. */
function planShards(tensors: SynthTensor[], max: number): SynthTensor[][] {
  const shards: SynthTensor[][] = [[]];
  let bytes = 0;
  for (const t of tensors) {
    const n = tensorBytes(t);
    if (bytes > 0 && bytes + n > max) {
      shards.push([]);
      bytes = 0;
    }
    shards[shards.length - 1].push(t);
    bytes += n;
  }
  return shards;
}

/** The safetensors header of `tensors` (sorted by name), padded with spaces to 8 bytes. */
function headerBytes(tensors: SynthTensor[]): Uint8Array {
  const h: Record<string, unknown> = { __metadata__: { format: "pt" } };
  let off = 0;
  for (const t of tensors) {
    const n = tensorBytes(t);
    h[t.name] = { dtype: t.dtype, shape: t.shape, data_offsets: [off, off + n] };
    off += n;
  }
  let json = JSON.stringify(h);
  json += " ".repeat((8 - ((json.length + 8) % 8)) % 8);
  const body = new TextEncoder().encode(json);
  const out = new Uint8Array(8 + body.length);
  new DataView(out.buffer).setBigUint64(0, BigInt(body.length), true);
  out.set(body, 8);
  return out;
}

function writeAll(fd: number, bytes: Uint8Array): void {
  let done = 0;
  while (done < bytes.length) done += writeSync(fd, bytes, done, bytes.length - done);
}

/** Streams one tensor's values into `fd` in chunks. */
function writeTensor(
  fd: number,
  t: SynthTensor,
  seed: number,
  plans: Map<number, RouterPlan>,
  buf: { u16: Uint16Array; f32: Float32Array },
  progress: Progress,
): void {
  const elems = t.shape.reduce((a, b) => a * b, 1);
  const bf16 = t.dtype === "BF16";
  const view = (n: number) => bf16 ? buf.u16.subarray(0, n) : buf.f32.subarray(0, n);
  const emit = (arr: Uint16Array | Float32Array) => {
    writeAll(fd, new Uint8Array(arr.buffer, arr.byteOffset, arr.byteLength));
    progress.add(arr.byteLength);
  };
  let x = streamSeed(seed, t.name);
  if (t.init.kind === "zeros") {
    for (let i = 0; i < elems; i += CHUNK_ELEMS) {
      emit(view(Math.min(CHUNK_ELEMS, elems - i)).fill(0));
    }
  } else if (t.init.kind === "router") {
    const plan = plans.get(t.layer);
    if (!plan) throw new Error(`${t.name}: no router plan for layer ${t.layer}`);
    const [rows, cols] = t.shape;
    for (let r = 0; r < rows; r++) {
      const table = valueTable(0, plan.scales[r] / Math.sqrt(cols), t.dtype);
      x = fillFrom(view(cols), table, x);
      emit(view(cols));
    }
  } else {
    const table = valueTable(t.init.mean, t.init.std, t.dtype);
    for (let i = 0; i < elems; i += CHUNK_ELEMS) {
      const v = view(Math.min(CHUNK_ELEMS, elems - i));
      x = fillFrom(v, table, x);
      emit(v);
    }
  }
}

function writeJson(path: string, v: unknown): void {
  Deno.writeTextFileSync(path, JSON.stringify(v, null, 2) + "\n");
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
  const tensors = synthTensors(opts.arch, d, dtype);
  const shards = planShards(tensors, maxShard);
  const tmp = `${opts.out}.tmp-${Deno.pid}`;
  rmSync(tmp, { recursive: true, force: true });
  mkdirSync(tmp, { recursive: true });
  try {
    writeJson(join(tmp, "config.json"), shape.config);
    writeJson(join(tmp, "generation_config.json"), {
      bos_token_id: SYNTH_BOS_ID,
      eos_token_id: SYNTH_EOS_ID,
      do_sample: false,
    });
    writeSynthTokenizer(tmp, d.vocab, d.maxPositions);
    const progress = new Progress({
      label: `synth ${basename(opts.out)}`,
      total: shape.dataBytes,
      mode: opts.progress ?? "auto",
    });
    const buf = { u16: new Uint16Array(CHUNK_ELEMS), f32: new Float32Array(CHUNK_ELEMS) };
    const names = shards.length === 1
      ? ["model.safetensors"]
      : shards.map((_, i) =>
        `model-${String(i + 1).padStart(5, "0")}-of-${
          String(shards.length).padStart(5, "0")
        }.safetensors`
      );
    const weightMap: Record<string, string> = {};
    let totalBytes = 0;
    shards.forEach((shard, i) => {
      const sorted = [...shard].sort((a, b) => a.name < b.name ? -1 : a.name > b.name ? 1 : 0);
      const header = headerBytes(sorted);
      const fd = openSync(join(tmp, names[i]), "w");
      try {
        writeAll(fd, header);
        for (const t of sorted) {
          writeTensor(fd, t, seed, plans, buf, progress);
          weightMap[t.name] = names[i];
        }
      } finally {
        closeSync(fd);
      }
      totalBytes += header.length + sumBytes(shard);
    });
    progress.finish();
    if (shards.length > 1) {
      writeJson(join(tmp, "model.safetensors.index.json"), {
        metadata: { total_size: shape.dataBytes },
        weight_map: Object.fromEntries(Object.entries(weightMap).sort()),
      });
    }
    if (existsSync(opts.out)) {
      const old = `${opts.out}.old-${Deno.pid}`;
      renameSync(opts.out, old);
      renameSync(tmp, opts.out);
      rmSync(old, { recursive: true, force: true });
    } else {
      renameSync(tmp, opts.out);
    }
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

// ---------------------------------------------------------------------------------------------
// CLI

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

const USAGE = `usage: deno task synth --arch qwen3_moe|deepseek_v3|mixtral --size 2G --out DIR
  [--dtype bf16|f32] [--routing uniform|skewed --trace DIR] [--seed N] [--force] [--quiet]
  [--max-shard SIZE]
  size overrides: --layers --experts --top-k --hidden --expert-inter --dense-inter --heads
  --kv-heads --head-dim --vocab --max-positions --q-lora-rank --kv-lora-rank --rope-dim
  --nope-dim --v-dim --first-dense --n-group --topk-group --shared-experts`;

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

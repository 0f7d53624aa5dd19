/**
 * Per-architecture recipes: the real models' ratios (Qwen3-30B-A3B, DeepSeek-V3 at hidden 2048,
 * Mixtral at hidden 1024, GLM-4.5-Air, gpt-oss-20b/120b, Kimi K3 at its real hidden 7168,
 * Qwen3.6-35B-A3B, DeepSeek-V4-Flash in its FP8/FP4 storage, GLM-5.3-Flash at its real hidden 4096
 * in its FP8 storage, Gemma-4-26B-A4B, MiniMax-M2, the last also in its FP8 release storage) as
 * functions of the hidden size, their config.json and their tensors.
 *
 * @module
 */

import { SYNTH_BOS_ID, SYNTH_EOS_ID } from "./tokenizer.ts";
import {
  embedding,
  globalTensors,
  glu,
  gqaAttention,
  linear,
  norm,
  PROJ,
  router,
} from "./builders.ts";
import { clamp } from "./numbers.ts";
import {
  SYNTH_ARCHS,
  type SynthArch,
  type SynthDims,
  type SynthDtype,
  type SynthElemType,
  type SynthInit,
  type SynthTensor,
} from "./types.ts";

/** Per-architecture recipe: real-model ratios as functions of the hidden size. */
export interface Recipe {
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
  /** The Hugging Face config.json. */
  config(d: SynthDims, dtype: SynthDtype): Record<string, unknown>;
  /** Tensors of layer `l` other than the routed experts. */
  layer(d: SynthDims, l: number, dt: SynthElemType): SynthTensor[];
  /** Tensors of one routed expert. */
  expert(d: SynthDims, l: number, e: number, dt: SynthElemType): SynthTensor[];
  /** Whether layer `l` has routed experts. */
  isMoe(d: SynthDims, l: number): boolean;
  /** Fewest layers the size solver tries. */
  minLayers(d: SynthDims): number;
  /** Hidden sizes the solver tries are multiples of this (gpt-oss's MXFP4 needs 32). */
  hiddenMultiple?: number;
  /** The global tensors, when not Hugging Face's usual `model.` names. */
  globals?(d: SynthDims, dt: SynthElemType): { head: SynthTensor[]; tail: SynthTensor[] };
  /** A name for the attention of layer `l`, when layers differ in it (hybrid models). */
  attentionOf?(d: SynthDims, l: number): string;
  /** Whether `--dtype fp8` has a layout here (FP8 matrices with 128×128 block scales). */
  fp8?: boolean;
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

/** The last fields of Qwen3-MoE's and Mixtral's config.json, in their order. */
function hfConfigTail(dtype: SynthDtype): Record<string, unknown> {
  return {
    initializer_range: 0.02,
    tie_word_embeddings: false,
    bos_token_id: SYNTH_BOS_ID,
    eos_token_id: SYNTH_EOS_ID,
    use_cache: true,
    torch_dtype: dtype === "bf16" ? "bfloat16" : "float32",
  };
}

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
    ...hfConfigTail(dtype),
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
    ...hfConfigTail(dtype),
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

/**
 * Layer `l`'s FFN tensors in DeepSeek's layout (DeepSeek-V3, GLM-4.5): a dense MLP before
 * `firstDense`, else the router, its selection bias and the shared experts.
 */
function groupedFfn(d: SynthDims, l: number, dt: SynthElemType): SynthTensor[] {
  const p = `model.layers.${l}.`;
  if (l < d.firstDense) return glu(p + "mlp.", PROJ, d.denseInter, d.hidden, dt, l);
  return [
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
}

/** The routed experts and layer kinds of the DeepSeek layout (after `firstDense` dense layers). */
const GROUPED_MOE: Pick<Recipe, "expert" | "isMoe" | "minLayers"> = {
  expert: (d, l, e, dt) =>
    glu(`model.layers.${l}.mlp.experts.${e}.`, PROJ, d.expertInter, d.hidden, dt, l),
  isMoe: (d, l) => l >= d.firstDense,
  minLayers: (d) => d.firstDense + 1,
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
    return [...out, ...groupedFfn(d, l, dt)];
  },
  ...GROUPED_MOE,
};

/**
 * GLM-4.5-Air (hidden 4096, 46 layers, 128 experts top-8, 96/8 heads of 128, one dense layer,
 * one shared expert, q/k/v biases, RoPE on half of each head, no q/k norm, no MTP layer).
 */
const GLM4_MOE: Recipe = {
  baseHidden: 4096,
  baseLayers: 46,
  baseExperts: 128,
  baseTopK: 8,
  expertStep: 8,
  maxExperts: 256,
  maxPositions: 131072,
  width: (h) => {
    const headDim = Math.round(clamp(h / 32, 16, 128));
    return {
      headDim,
      // Air: 96 query heads of 128 on hidden 4096 (q is 3 × hidden), 8 kv heads.
      ...gqaHeads((3 * h) / headDim, 12),
      // Air: moe_intermediate 1408, dense 10944, of hidden 4096.
      expertInter: 32 * Math.max(1, Math.round((1408 / 4096) * h / 32)),
      denseInter: 32 * Math.max(1, Math.round((10944 / 4096) * h / 32)),
      sharedExperts: 1,
    };
  },
  counts: (d) => ({ topK: defaultTopK(d.experts, 8), firstDense: 1 }),
  config: (d, dtype) => ({
    architectures: ["Glm4MoeForCausalLM"],
    model_type: "glm4_moe",
    vocab_size: d.vocab,
    hidden_size: d.hidden,
    intermediate_size: d.denseInter,
    moe_intermediate_size: d.expertInter,
    num_hidden_layers: d.layers,
    num_nextn_predict_layers: 0,
    first_k_dense_replace: d.firstDense,
    n_routed_experts: d.experts,
    num_experts_per_tok: d.topK,
    n_shared_experts: d.sharedExperts,
    n_group: 1,
    topk_group: 1,
    norm_topk_prob: true,
    routed_scaling_factor: 1,
    num_attention_heads: d.heads,
    num_key_value_heads: d.kvHeads,
    head_dim: d.headDim,
    partial_rotary_factor: 0.5,
    attention_bias: true,
    use_qk_norm: false,
    hidden_act: "silu",
    max_position_embeddings: d.maxPositions,
    rms_norm_eps: 1e-5,
    rope_theta: 1e6,
    rope_scaling: null,
    attention_dropout: 0,
    pad_token_id: null,
    ...hfConfigTail(dtype),
  }),
  layer: (d, l, dt) => {
    const p = `model.layers.${l}.`;
    const bias = (name: string, n: number): SynthTensor => ({
      name: p + name,
      shape: [n],
      dtype: dt,
      init: { kind: "normal", mean: 0, std: 0.02 },
      layer: l,
    });
    const out = [
      ...gqaAttention(d, l, dt),
      bias("self_attn.q_proj.bias", d.heads * d.headDim),
      bias("self_attn.k_proj.bias", d.kvHeads * d.headDim),
      bias("self_attn.v_proj.bias", d.kvHeads * d.headDim),
    ];
    return [...out, ...groupedFfn(d, l, dt)];
  },
  ...GROUPED_MOE,
};

/** E8M0 bytes whose random E2M1 codes (mean |value| ≈ 2.4) give weights of std ≈ 1/√fan_in. */
function mxfp4ScaleBytes(fanIn: number): { kind: "bytes"; lo: number; hi: number } {
  const e = 127 + Math.round(Math.log2(1 / Math.sqrt(fanIn) / 2.4));
  return { kind: "bytes", lo: e - 1, hi: e };
}

/**
 * gpt-oss-20b (hidden 2880, 24 layers, 32 experts top-4, 64 query heads and 8 kv heads of 64,
 * expert intermediate = hidden) and -120b (36 layers, 128 experts): every layer MoE, experts as
 * OpenAI ships them (fused MXFP4 blocks and scales, BF16 biases, random codes), q/k/v/o biases,
 * sinks, alternating sliding (128) and full attention, YaRN with truncate false.
 */
const GPT_OSS: Recipe = {
  baseHidden: 2880,
  baseLayers: 24,
  baseExperts: 32,
  baseTopK: 4,
  expertStep: 8,
  maxExperts: 128,
  maxPositions: 131072,
  hiddenMultiple: 32,
  width: (h) => {
    const headDim = Math.round(clamp(h / 45, 16, 64));
    // 20b: 64 query heads of 64 on hidden 2880 (q is 1.42 × hidden), 8 kv heads.
    return { headDim, ...gqaHeads((64 * h) / 2880, 8), expertInter: 32 * Math.round(h / 32) };
  },
  counts: (d) => ({ topK: Math.min(4, d.experts) }),
  config: (d, dtype) => ({
    architectures: ["GptOssForCausalLM"],
    model_type: "gpt_oss",
    attention_bias: true,
    attention_dropout: 0,
    experts_per_token: d.topK,
    head_dim: d.headDim,
    hidden_act: "silu",
    hidden_size: d.hidden,
    initial_context_length: 4096,
    intermediate_size: d.expertInter,
    layer_types: Array.from(
      { length: d.layers },
      (_, l) => l % 2 === 0 ? "sliding_attention" : "full_attention",
    ),
    max_position_embeddings: d.maxPositions,
    num_attention_heads: d.heads,
    num_experts_per_tok: d.topK,
    num_hidden_layers: d.layers,
    num_key_value_heads: d.kvHeads,
    num_local_experts: d.experts,
    quantization_config: {
      modules_to_not_convert: [
        "model.layers.*.self_attn",
        "model.layers.*.mlp.router",
        "model.embed_tokens",
        "lm_head",
      ],
      quant_method: "mxfp4",
    },
    rms_norm_eps: 1e-5,
    rope_scaling: {
      beta_fast: 32,
      beta_slow: 1,
      factor: 32,
      original_max_position_embeddings: 4096,
      rope_type: "yarn",
      truncate: false,
    },
    rope_theta: 150000,
    sliding_window: 128,
    swiglu_limit: 7,
    vocab_size: d.vocab,
    ...hfConfigTail(dtype),
  }),
  layer: (d, l, dt) => {
    const p = `model.layers.${l}.`;
    const vec = (name: string, n: number, std = 0.02): SynthTensor => ({
      name: p + name,
      shape: [n],
      dtype: dt,
      init: { kind: "normal", mean: 0, std },
      layer: l,
    });
    const fused = (base: string, rows: number, cols: number): SynthTensor[] => [
      {
        name: `${p}mlp.experts.${base}_blocks`,
        shape: [d.experts, rows, cols / 32, 16],
        dtype: "U8",
        init: { kind: "bytes", lo: 0, hi: 255 },
        layer: l,
      },
      {
        name: `${p}mlp.experts.${base}_scales`,
        shape: [d.experts, rows, cols / 32],
        dtype: "U8",
        init: mxfp4ScaleBytes(cols),
        layer: l,
      },
      {
        name: `${p}mlp.experts.${base}_bias`,
        shape: [d.experts, rows],
        dtype: "BF16",
        init: { kind: "normal", mean: 0, std: 0.02 },
        layer: l,
      },
    ];
    return [
      ...gqaAttention(d, l, dt),
      vec("self_attn.q_proj.bias", d.heads * d.headDim),
      vec("self_attn.k_proj.bias", d.kvHeads * d.headDim),
      vec("self_attn.v_proj.bias", d.kvHeads * d.headDim),
      vec("self_attn.o_proj.bias", d.hidden),
      vec("self_attn.sinks", d.heads, 1),
      router(p + "mlp.router.weight", d.experts, d.hidden, dt, l),
      {
        name: p + "mlp.router.bias",
        shape: [d.experts],
        dtype: dt,
        init: { kind: "zeros" },
        layer: l,
      },
      ...fused("gate_up_proj", 2 * d.expertInter, d.hidden),
      ...fused("down_proj", d.hidden, d.expertInter),
    ];
  },
  // The experts are fused per layer (in layer()), not one tensor set per expert.
  expert: () => [],
  isMoe: () => true,
  minLayers: () => 2,
};

/** Kimi K3's tensor prefix. */
const K3 = "language_model.model.";

/** A float tensor kept F32 whatever the trunk dtype (as the release keeps them). */
function f32(name: string, shape: number[], mean: number, std: number, l: number): SynthTensor {
  return { name, shape, dtype: "F32", init: { kind: "normal", mean, std }, layer: l };
}

/**
 * One MXFP4 matrix [rows, cols] as the K3 release ships it: random E2M1 codes (`weight_packed`,
 * two a byte) and one E8M0 scale byte per 32 columns, chosen so that the weights' RMS is about
 * 1/sqrt(cols) (random codes have an RMS of 2.93).
 */
function mxfp4(name: string, rows: number, cols: number, l: number): SynthTensor[] {
  return e2m1Matrix(`${name}_packed`, `${name}_scale`, ["U8", "U8"], rows, cols, l);
}

/**
 * Random E2M1 codes [rows, cols/2] named `codes` and their E8M0 scales [rows, cols/32] named
 * `scales` (of the two dtypes), the weights' RMS about 1/sqrt(cols).
 */
function e2m1Matrix(
  codes: string,
  scales: string,
  dtypes: [SynthElemType, SynthElemType],
  rows: number,
  cols: number,
  l: number,
): SynthTensor[] {
  const exp = 127 + Math.round(Math.log2(1 / (2.93 * Math.sqrt(cols))));
  return [
    {
      name: codes,
      shape: [rows, cols / 2],
      dtype: dtypes[0],
      init: { kind: "bytes", lo: 0, hi: 255 },
      layer: l,
    },
    {
      name: scales,
      shape: [rows, cols / 32],
      dtype: dtypes[1],
      init: { kind: "fill", value: exp },
      layer: l,
    },
  ];
}

/** Whether layer `l` of a K3-shaped model is MLA (1-based every mlaEvery-th, and the last). */
function k3IsMla(d: SynthDims, l: number): boolean {
  return (l + 1) % d.mlaEvery === 0 || l === d.layers - 1;
}

const KIMI_K3: Recipe = {
  baseHidden: 7168,
  baseLayers: 93,
  baseExperts: 896,
  baseTopK: 16,
  expertStep: 16,
  maxExperts: 896,
  maxPositions: 262144,
  width: (h) => {
    // The release at 7168: KDA and MLA 96 heads of 128, q_lora 1536, kv_lora 512, rope 64,
    // latent 3584, expert inter 3072, dense inter 33,792.
    const headDim = Math.round(clamp(h / 56, 16, 128));
    const heads = Math.max(1, Math.round((96 * h) / 7168));
    return {
      heads,
      kdaHeads: heads,
      kdaHeadDim: headDim,
      headDim,
      qLoraRank: (3 * h) / 14,
      kvLoraRank: h / 14,
      nopeDim: headDim,
      ropeDim: headDim / 2,
      vDim: headDim,
      latent: h / 2,
      expertInter: (3 * h) / 7,
      denseInter: (33792 * h) / 7168,
      sharedExperts: 2,
      mlaEvery: 4,
      mxfp4Experts: 1,
    };
  },
  counts: (d) => ({
    topK: defaultTopK(d.experts, 16),
    firstDense: 1,
    nGroup: 1,
    topkGroup: 1,
    // The release: 93 layers in blocks of 12.
    attnResBlock: clamp(Math.ceil(d.layers / 8), 1, 12),
  }),
  config: (d, dtype) => {
    const mla = Array.from({ length: d.layers }, (_, l) => l).filter((l) => k3IsMla(d, l));
    const text = {
      activation_situ_beta: 4.0,
      activation_situ_linear_beta: 25.0,
      architectures: ["KimiLinearForCausalLM"],
      attn_res_block_size: d.attnResBlock,
      first_k_dense_replace: d.firstDense,
      hidden_act: "situ",
      hidden_size: d.hidden,
      intermediate_size: d.denseInter,
      kv_lora_rank: d.kvLoraRank,
      latent_moe_use_norm: true,
      linear_attn_config: {
        full_attn_layers: mla.map((l) => l + 1),
        gate_lower_bound: -5.0,
        head_dim: d.kdaHeadDim,
        kda_layers: Array.from({ length: d.layers }, (_, l) => l + 1).filter((l) =>
          !k3IsMla(d, l - 1)
        ),
        num_heads: d.kdaHeads,
        short_conv_kernel_size: 4,
        use_full_rank_gate: true,
      },
      max_position_embeddings: d.maxPositions,
      mla_use_nope: true,
      mla_use_output_gate: true,
      model_type: "kimi_linear",
      moe_intermediate_size: d.expertInter,
      moe_layer_freq: 1,
      moe_renormalize: true,
      moe_router_activation_func: "sigmoid",
      num_attention_heads: d.heads,
      num_expert_group: 1,
      num_experts: d.experts,
      num_experts_per_token: d.topK,
      num_hidden_layers: d.layers,
      num_key_value_heads: d.heads,
      num_nextn_predict_layers: 0,
      num_shared_experts: d.sharedExperts,
      q_lora_rank: d.qLoraRank,
      qk_nope_head_dim: d.nopeDim,
      qk_rope_head_dim: d.ropeDim,
      rms_norm_eps: 1e-5,
      rope_theta: 10000.0,
      routed_expert_hidden_size: d.latent,
      routed_scaling_factor: 1.0,
      tie_word_embeddings: false,
      topk_group: 1,
      topk_method: "noaux_tc",
      use_grouped_topk: true,
      v_head_dim: d.vDim,
      vocab_size: d.vocab,
      bos_token_id: SYNTH_BOS_ID,
      eos_token_id: SYNTH_EOS_ID,
      dtype: dtype === "bf16" ? "bfloat16" : "float32",
    };
    return {
      architectures: ["KimiK3ForConditionalGeneration"],
      model_type: "kimi_k3",
      text_config: text,
      tie_word_embeddings: false,
      dtype: text.dtype,
    };
  },
  layer: (d, l, dt) => {
    const p = `${K3}layers.${l}.`, a = p + "self_attn.";
    const out: SynthTensor[] = [
      norm(p + "input_layernorm.weight", d.hidden, dt, l),
      norm(p + "post_attention_layernorm.weight", d.hidden, dt, l),
      norm(p + "self_attention_res_norm.weight", d.hidden, dt, l),
      linear(p + "self_attention_res_proj.weight", 1, d.hidden, dt, l),
      norm(p + "mlp_res_norm.weight", d.hidden, dt, l),
      linear(p + "mlp_res_proj.weight", 1, d.hidden, dt, l),
    ];
    if (k3IsMla(d, l)) {
      out.push(
        linear(a + "q_a_proj.weight", d.qLoraRank, d.hidden, dt, l),
        norm(a + "q_a_layernorm.weight", d.qLoraRank, dt, l),
        linear(a + "q_b_proj.weight", d.heads * (d.nopeDim + d.ropeDim), d.qLoraRank, dt, l),
        linear(a + "kv_a_proj_with_mqa.weight", d.kvLoraRank + d.ropeDim, d.hidden, dt, l),
        norm(a + "kv_a_layernorm.weight", d.kvLoraRank, dt, l),
        linear(a + "kv_b_proj.weight", d.heads * (d.nopeDim + d.vDim), d.kvLoraRank, dt, l),
        linear(a + "g_proj.weight", d.heads * d.vDim, d.hidden, dt, l),
        linear(a + "o_proj.weight", d.hidden, d.heads * d.vDim, dt, l),
      );
    } else {
      const P = d.kdaHeads * d.kdaHeadDim, D = d.kdaHeadDim;
      if (d.kdaHeads > D) {
        throw new Error(`kimi_k3: A_log holds headDim ${D} values, fewer than ${d.kdaHeads} heads`);
      }
      for (const x of ["q", "k", "v"]) {
        out.push(
          linear(`${a}${x}_proj.weight`, P, d.hidden, dt, l),
          f32(`${a}${x}_conv1d.weight`, [P, 1, 4], 0, 0.5, l),
        );
      }
      out.push(
        linear(a + "f_a_proj.weight", D, d.hidden, dt, l),
        linear(a + "f_b_proj.weight", P, D, dt, l),
        linear(a + "b_proj.weight", d.kdaHeads, d.hidden, dt, l),
        f32(a + "dt_bias", [P], 0, 1, l),
        f32(a + "A_log", [D], 0, 0.5, l),
        f32(a + "o_norm.weight", [D], 1, 0.05, l),
        linear(a + "g_proj.weight", P, d.hidden, dt, l),
        linear(a + "o_proj.weight", d.hidden, P, dt, l),
      );
    }
    if (l < d.firstDense) return [...out, ...glu(p + "mlp.", PROJ, d.denseInter, d.hidden, dt, l)];
    const m = p + "block_sparse_moe.";
    return [
      ...out,
      router(m + "gate.weight", d.experts, d.hidden, dt, l),
      {
        name: m + "gate.e_score_correction_bias",
        shape: [d.experts],
        dtype: "F32",
        init: { kind: "zeros" },
        layer: l,
      },
      linear(m + "routed_expert_down_proj.weight", d.latent, d.hidden, dt, l),
      norm(m + "routed_expert_norm.weight", d.latent, dt, l),
      linear(m + "routed_expert_up_proj.weight", d.hidden, d.latent, dt, l),
      ...glu(m + "shared_experts.", PROJ, d.expertInter * d.sharedExperts, d.hidden, dt, l),
    ];
  },
  expert: (d, l, e, dt) => {
    const p = `${K3}layers.${l}.block_sparse_moe.experts.${e}.`;
    if (!d.mxfp4Experts) return glu(p, ["w1", "w3", "w2"], d.expertInter, d.latent, dt, l);
    if (d.latent % 32 || d.expertInter % 32) {
      throw new Error(
        `kimi_k3: MXFP4 experts need latent ${d.latent} and expertInter ${d.expertInter} to be ` +
          `multiples of 32 (or mxfp4Experts 0)`,
      );
    }
    return [
      ...mxfp4(p + "w1.weight", d.expertInter, d.latent, l),
      ...mxfp4(p + "w2.weight", d.latent, d.expertInter, l),
      ...mxfp4(p + "w3.weight", d.expertInter, d.latent, l),
    ];
  },
  isMoe: (d, l) => l >= d.firstDense,
  minLayers: (d) => d.firstDense + 1,
  globals: (d, dt) => ({
    head: [embedding(`${K3}embed_tokens.weight`, d, dt)],
    tail: [
      norm(`${K3}norm.weight`, d.hidden, dt, -1),
      norm(`${K3}output_attn_res_norm.weight`, d.hidden, dt, -1),
      linear(`${K3}output_attn_res_proj.weight`, 1, d.hidden, dt, -1),
      linear("language_model.lm_head.weight", d.vocab, d.hidden, dt, -1),
    ],
  }),
  attentionOf: (d, l) => k3IsMla(d, l) ? "mla" : "kda",
};

/** Qwen3.5's tensor prefix. */
const Q35 = "model.language_model.";

/** Whether layer `l` of a Qwen3.5 or Gemma 4 model is full attention (every fullEvery-th, 1-based). */
const q35IsFull = (d: SynthDims, l: number) => (l + 1) % d.fullEvery === 0;

/** `layer_types`: full attention where {@link q35IsFull}, `other` elsewhere. */
const hybridLayerTypes = (d: SynthDims, other: string) =>
  Array.from({ length: d.layers }, (_, l) => q35IsFull(d, l) ? "full_attention" : other);

/**
 * Layer `l`'s routed experts stacked as Qwen3.5 and Gemma 4 release them, under `prefix`:
 * `experts.gate_up_proj` [E, 2I, H] and `experts.down_proj` [E, H, I], without a `.weight` suffix.
 */
function stackedExperts(prefix: string, d: SynthDims, dt: SynthElemType, l: number): SynthTensor[] {
  const I = d.expertInter;
  const one = (name: string, shape: number[], fanIn: number): SynthTensor => ({
    name: prefix + name,
    shape,
    dtype: dt,
    init: { kind: "normal", mean: 0, std: 1 / Math.sqrt(fanIn) },
    layer: l,
  });
  return [
    one("experts.gate_up_proj", [d.experts, 2 * I, d.hidden], d.hidden),
    one("experts.down_proj", [d.experts, d.hidden, I], I),
  ];
}

/** The `model.language_model.` embedding with values of std `std`. */
function q35Embedding(d: SynthDims, dt: SynthElemType, std: number): SynthTensor {
  return {
    name: `${Q35}embed_tokens.weight`,
    shape: [d.vocab, d.hidden],
    dtype: dt,
    init: { kind: "normal", mean: 0, std },
    layer: -1,
  };
}

/** A (1 + w) RMSNorm weight: 0.05·n, so the scale is about 1. */
function unitNorm(name: string, n: number, dt: SynthElemType, l: number): SynthTensor {
  return { name, shape: [n], dtype: dt, init: { kind: "normal", mean: 0, std: 0.05 }, layer: l };
}

/**
 * Qwen3.5/3.6-MoE (`Qwen3_5MoeForConditionalGeneration`, text model only) at Qwen3.6-35B-A3B's
 * ratios (hidden 2048, 40 layers of which every 4th full attention, 256 experts top-8 of width
 * 512, a shared expert of 512, attention 16/2 heads × 256, Gated DeltaNet 16 key / 32 value heads
 * × 128): the release's nested config and names, stacked experts, (1 + w) norms.
 */
const QWEN3_5_MOE: Recipe = {
  baseHidden: 2048,
  baseLayers: 40,
  baseExperts: 256,
  baseTopK: 8,
  expertStep: 8,
  maxExperts: 512,
  maxPositions: 262144,
  width: (h) => {
    // Partial rotary 0.25 needs an even rotary slice: head dims are multiples of 8.
    const headDim = 8 * Math.max(1, Math.round(clamp(h / 8, 16, 256) / 8));
    const gdnDim = Math.round(clamp(h / 16, 8, 128));
    const gdnKeyHeads = Math.max(1, Math.round(h / gdnDim));
    return {
      headDim,
      ...gqaHeads((2 * h) / headDim, 8),
      gdnKeyHeads,
      gdnValueHeads: 2 * gdnKeyHeads,
      gdnKeyDim: gdnDim,
      gdnValueDim: gdnDim,
      fullEvery: 4,
      expertInter: h / 4,
      sharedInter: h / 4,
    };
  },
  counts: (d) => ({ topK: defaultTopK(d.experts, 8) }),
  config: (d, dtype) => {
    const text = {
      model_type: "qwen3_5_moe_text",
      vocab_size: d.vocab,
      hidden_size: d.hidden,
      num_hidden_layers: d.layers,
      layer_types: hybridLayerTypes(d, "linear_attention"),
      full_attention_interval: d.fullEvery,
      num_attention_heads: d.heads,
      num_key_value_heads: d.kvHeads,
      head_dim: d.headDim,
      attn_output_gate: true,
      attention_bias: false,
      partial_rotary_factor: 0.25,
      rope_parameters: { rope_type: "default", rope_theta: 1e7, partial_rotary_factor: 0.25 },
      linear_num_key_heads: d.gdnKeyHeads,
      linear_num_value_heads: d.gdnValueHeads,
      linear_key_head_dim: d.gdnKeyDim,
      linear_value_head_dim: d.gdnValueDim,
      linear_conv_kernel_dim: 4,
      num_experts: d.experts,
      num_experts_per_tok: d.topK,
      moe_intermediate_size: d.expertInter,
      shared_expert_intermediate_size: d.sharedInter,
      hidden_act: "silu",
      max_position_embeddings: d.maxPositions,
      rms_norm_eps: 1e-6,
      tie_word_embeddings: false,
      bos_token_id: SYNTH_BOS_ID,
      eos_token_id: SYNTH_EOS_ID,
      dtype: dtype === "bf16" ? "bfloat16" : "float32",
    };
    return {
      architectures: ["Qwen3_5MoeForConditionalGeneration"],
      model_type: "qwen3_5_moe",
      text_config: text,
      tie_word_embeddings: false,
      dtype: text.dtype,
    };
  },
  layer: (d, l, dt) => {
    const p = `${Q35}layers.${l}.`;
    const out: SynthTensor[] = [
      unitNorm(p + "input_layernorm.weight", d.hidden, dt, l),
      unitNorm(p + "post_attention_layernorm.weight", d.hidden, dt, l),
    ];
    if (q35IsFull(d, l)) {
      const a = p + "self_attn.", q = d.heads * d.headDim, kv = d.kvHeads * d.headDim;
      out.push(
        linear(a + "q_proj.weight", 2 * q, d.hidden, dt, l),
        linear(a + "k_proj.weight", kv, d.hidden, dt, l),
        linear(a + "v_proj.weight", kv, d.hidden, dt, l),
        linear(a + "o_proj.weight", d.hidden, q, dt, l),
        unitNorm(a + "q_norm.weight", d.headDim, dt, l),
        unitNorm(a + "k_norm.weight", d.headDim, dt, l),
      );
    } else {
      const a = p + "linear_attn.", Hv = d.gdnValueHeads, vDim = Hv * d.gdnValueDim;
      const C = 2 * d.gdnKeyHeads * d.gdnKeyDim + vDim;
      out.push(
        linear(a + "in_proj_qkv.weight", C, d.hidden, dt, l),
        linear(a + "in_proj_z.weight", vDim, d.hidden, dt, l),
        linear(a + "in_proj_b.weight", Hv, d.hidden, dt, l),
        linear(a + "in_proj_a.weight", Hv, d.hidden, dt, l),
        f32(a + "conv1d.weight", [C, 1, 4], 0, 0.5, l),
        f32(a + "dt_bias", [Hv], -3, 1, l),
        f32(a + "A_log", [Hv], 1.5, 0.5, l),
        f32(a + "norm.weight", [d.gdnValueDim], 1, 0.05, l),
        linear(a + "out_proj.weight", d.hidden, vDim, dt, l),
      );
    }
    const m = p + "mlp.";
    return [
      ...out,
      router(m + "gate.weight", d.experts, d.hidden, dt, l),
      ...stackedExperts(m, d, dt, l),
      ...glu(m + "shared_expert.", PROJ, d.sharedInter, d.hidden, dt, l),
      linear(m + "shared_expert_gate.weight", 1, d.hidden, dt, l),
    ];
  },
  // The experts are stacked per layer (in layer()), not one tensor set per expert.
  expert: () => [],
  isMoe: () => true,
  minLayers: (d) => d.fullEvery,
  globals: (d, dt) => ({
    head: [q35Embedding(d, dt, 1)],
    tail: [
      unitNorm(`${Q35}norm.weight`, d.hidden, dt, -1),
      linear("lm_head.weight", d.vocab, d.hidden, dt, -1),
    ],
  }),
  attentionOf: (d, l) => q35IsFull(d, l) ? "full" : "gdn",
};

/**
 * DeepSeek-V4's compress ratio of layer `l` as the release lays them out: two window-only layers,
 * then CSA (4, indexed) on even and HCA (128) on odd layers.
 */
const v4Ratio = (l: number) => l < 2 ? 0 : l % 2 ? 128 : 4;

/** Std of the synthetic FP8 linears' E4M3 codes; their block scales bring it to 1/sqrt(in). */
const E4M3_CODE_STD = 16;

/** The E4M3 codes [out, in] of an FP8 linear named `name`. */
function e4m3Codes(name: string, out: number, inp: number, l: number): SynthTensor {
  const init: SynthInit = { kind: "e4m3", std: E4M3_CODE_STD };
  return { name, shape: [out, inp], dtype: "F8_E4M3", init, layer: l };
}

/**
 * An FP8 E4M3 matrix `name` [out, in] with its F32 `name_scale_inv` per 128 × 128 block, as
 * GLM-5.3-Flash and MiniMax-M2 ship them. The scale is a power of two, so every weight is exactly a
 * bf16 value and a bf16 GGUF export holds the same function.
 */
function fp8ScaleInv(name: string, out: number, inp: number, l: number): SynthTensor[] {
  const scale = 2 ** Math.round(Math.log2(1 / (Math.sqrt(inp) * E4M3_CODE_STD)));
  return [
    e4m3Codes(name, out, inp, l),
    f32(`${name}_scale_inv`, [Math.ceil(out / 128), Math.ceil(inp / 128)], scale, 0, l),
  ];
}

/**
 * An FP8 E4M3 linear `name.weight` [out, in] with its E8M0 128 × 128 block scales `name.scale`
 * (a block may be narrower), as DeepSeek-V4 ships its linears: codes of std 16 times a power of
 * two near 1/(16·sqrt(in)), so the weights' std is about 1/sqrt(in).
 */
function fp8Linear(name: string, out: number, inp: number, l: number): SynthTensor[] {
  const exp = 127 + Math.round(Math.log2(1 / (E4M3_CODE_STD * Math.sqrt(inp))));
  return [
    e4m3Codes(`${name}.weight`, out, inp, l),
    {
      name: `${name}.scale`,
      shape: [Math.ceil(out / 128), Math.ceil(inp / 128)],
      dtype: "F8_E8M0",
      init: { kind: "fill", value: exp },
      layer: l,
    },
  ];
}

/** A hyper-connection's mixing weights `<p>fn`, `<p>base`, `<p>scale` for `n` streams (F32). */
function hyperTensors(p: string, rows: number, n: number, h: number, l: number): SynthTensor[] {
  return [
    f32(`${p}fn`, [rows, n * h], 0, 1 / Math.sqrt(n * h), l),
    f32(`${p}base`, [rows], 0, 0.5, l),
    f32(`${p}scale`, [rows === n ? 1 : 3], 1.1, 0.1, l),
  ];
}

/**
 * DeepSeek-V4-Flash (`DeepseekV4ForCausalLM`, hidden 4096, 43 layers, 64 heads × 512 sharing one
 * KV head with RoPE on the last 64 dims, q_lora 1024, 8 output groups of rank 1024, window 128,
 * CSA/HCA compressors, a 64 × 128 Lightning indexer keeping 512 entries, 256 experts top-6 of width
 * 2048, a shared expert, 3 hash-routed layers, 4 hyper-connection streams) in the release's
 * storage and original names: FP8 E4M3 linears with E8M0 128 × 128 `.scale` blocks, routed experts
 * in FP4 (e2m1 in I8) with an E8M0 scale per 32 inputs, BF16 norms, compressors, indexer weights,
 * router, embedding and head, F32 hyper-connections, sinks, position biases and selection bias,
 * I64 `tid2eid`. No MTP layer is written (num_nextn_predict_layers 0).
 */
const DEEPSEEK_V4: Recipe = {
  baseHidden: 4096,
  baseLayers: 43,
  baseExperts: 256,
  baseTopK: 6,
  expertStep: 8,
  maxExperts: 512,
  maxPositions: 1048576,
  // FP4 experts need 32 | hidden and 32 | expert inter (hidden / 2).
  hiddenMultiple: 64,
  width: (h) => {
    const headDim = 16 * Math.round(clamp(h / 8, 16, 512) / 16);
    const heads = Math.max(1, Math.round((64 * h) / 4096));
    let oGroups = 8;
    while (heads % oGroups) oGroups /= 2;
    return {
      heads,
      headDim,
      ropeDim: headDim / 8,
      qLoraRank: h / 4,
      oGroups,
      oLoraRank: h / 4,
      window: 128,
      indexHeads: heads,
      indexHeadDim: Math.max(2, headDim / 4),
      indexTopK: 512,
      expertInter: h / 2,
      sharedExperts: 1,
      hcMult: 4,
    };
  },
  counts: (d) => ({ topK: defaultTopK(d.experts, 6), hashLayers: Math.min(3, d.layers) }),
  config: (d, dtype) => ({
    architectures: ["DeepseekV4ForCausalLM"],
    model_type: "deepseek_v4",
    attention_bias: false,
    attention_dropout: 0,
    bos_token_id: SYNTH_BOS_ID,
    eos_token_id: SYNTH_EOS_ID,
    hc_eps: 1e-6,
    hc_mult: d.hcMult,
    hc_sinkhorn_iters: 20,
    head_dim: d.headDim,
    hidden_act: "silu",
    hidden_size: d.hidden,
    index_head_dim: d.indexHeadDim,
    index_n_heads: d.indexHeads,
    index_topk: d.indexTopK,
    initializer_range: 0.02,
    max_position_embeddings: d.maxPositions,
    moe_intermediate_size: d.expertInter,
    n_routed_experts: d.experts,
    n_shared_experts: d.sharedExperts,
    norm_topk_prob: true,
    num_attention_heads: d.heads,
    num_experts_per_tok: d.topK,
    num_hidden_layers: d.layers,
    num_hash_layers: d.hashLayers,
    num_key_value_heads: 1,
    num_nextn_predict_layers: 0,
    o_groups: d.oGroups,
    o_lora_rank: d.oLoraRank,
    q_lora_rank: d.qLoraRank,
    qk_rope_head_dim: d.ropeDim,
    rms_norm_eps: 1e-6,
    rope_scaling: {
      beta_fast: 32,
      beta_slow: 1,
      factor: 16,
      original_max_position_embeddings: 65536,
      type: "yarn",
    },
    rope_theta: 10000,
    routed_scaling_factor: 1.5,
    scoring_func: "sqrtsoftplus",
    sliding_window: d.window,
    swiglu_limit: 10.0,
    tie_word_embeddings: false,
    topk_method: "noaux_tc",
    torch_dtype: dtype === "bf16" ? "bfloat16" : "float32",
    use_cache: true,
    vocab_size: d.vocab,
    compress_rope_theta: 160000,
    compress_ratios: Array.from({ length: d.layers }, (_, l) => v4Ratio(l)),
    expert_dtype: "fp4",
    quantization_config: {
      activation_scheme: "dynamic",
      fmt: "e4m3",
      quant_method: "fp8",
      scale_fmt: "ue8m0",
      weight_block_size: [128, 128],
    },
  }),
  layer: (d, l, dt) => {
    const p = `layers.${l}.`, a = p + "attn.", hd = d.headDim, n = d.hcMult;
    const ratio = v4Ratio(l), G = d.oGroups, R = d.oLoraRank;
    const out: SynthTensor[] = [
      norm(p + "attn_norm.weight", d.hidden, dt, l),
      norm(p + "ffn_norm.weight", d.hidden, dt, l),
      ...hyperTensors(p + "hc_attn_", (2 + n) * n, n, d.hidden, l),
      ...hyperTensors(p + "hc_ffn_", (2 + n) * n, n, d.hidden, l),
      ...fp8Linear(a + "wq_a", d.qLoraRank, d.hidden, l),
      norm(a + "q_norm.weight", d.qLoraRank, dt, l),
      ...fp8Linear(a + "wq_b", d.heads * hd, d.qLoraRank, l),
      ...fp8Linear(a + "wkv", hd, d.hidden, l),
      norm(a + "kv_norm.weight", hd, dt, l),
      ...fp8Linear(a + "wo_a", G * R, (d.heads * hd) / G, l),
      ...fp8Linear(a + "wo_b", d.hidden, G * R, l),
      f32(a + "attn_sink", [d.heads], 0, 1, l),
    ];
    // A compressor: kv and gate projections (the gate's std twice the kv's), position biases.
    const compressor = (c: string, width: number, normDim: number) => [
      linear(c + "wkv.weight", width, d.hidden, dt, l),
      { ...linear(c + "wgate.weight", width, d.hidden, dt, l), init: gateInit(d.hidden) },
      f32(c + "ape", [ratio, width], 0, 1, l),
      norm(c + "norm.weight", normDim, dt, l),
    ];
    if (ratio) out.push(...compressor(a + "compressor.", ratio === 4 ? 2 * hd : hd, hd));
    if (ratio === 4) {
      const ix = a + "indexer.";
      out.push(
        ...fp8Linear(ix + "wq_b", d.indexHeads * d.indexHeadDim, d.qLoraRank, l),
        linear(ix + "weights_proj.weight", d.indexHeads, d.hidden, dt, l),
        ...compressor(ix + "compressor.", 2 * d.indexHeadDim, d.indexHeadDim),
      );
    }
    const f = p + "ffn.", shared = d.expertInter * d.sharedExperts;
    out.push(router(f + "gate.weight", d.experts, d.hidden, dt, l));
    if (l < d.hashLayers) {
      out.push({
        name: f + "gate.tid2eid",
        shape: [d.vocab, d.topK],
        dtype: "I64",
        init: { kind: "hash", experts: d.experts },
        layer: l,
      });
    } else {
      out.push({
        name: f + "gate.bias",
        shape: [d.experts],
        dtype: "F32",
        init: { kind: "zeros" },
        layer: l,
      });
    }
    if (shared) {
      out.push(
        ...fp8Linear(f + "shared_experts.w1", shared, d.hidden, l),
        ...fp8Linear(f + "shared_experts.w2", d.hidden, shared, l),
        ...fp8Linear(f + "shared_experts.w3", shared, d.hidden, l),
      );
    }
    return out;
  },
  expert: (d, l, e) => {
    const p = `layers.${l}.ffn.experts.${e}.`, I = d.expertInter;
    if (d.hidden % 32 || I % 32) {
      throw new Error(
        `deepseek_v4: FP4 experts need hidden ${d.hidden} and expertInter ${I} to be multiples ` +
          `of 32`,
      );
    }
    const fp4 = (w: string, rows: number, cols: number) =>
      e2m1Matrix(`${p}${w}.weight`, `${p}${w}.scale`, ["I8", "F8_E8M0"], rows, cols, l);
    return [...fp4("w1", I, d.hidden), ...fp4("w2", d.hidden, I), ...fp4("w3", I, d.hidden)];
  },
  isMoe: () => true,
  minLayers: () => 4,
  globals: (d, dt) => ({
    head: [embedding("embed.weight", d, dt)],
    tail: [
      norm("norm.weight", d.hidden, dt, -1),
      ...hyperTensors("hc_head_", d.hcMult, d.hcMult, d.hidden, -1),
      linear("head.weight", d.vocab, d.hidden, dt, -1),
    ],
  }),
  // Hash layers hold a tid2eid table where the others hold a bias: another kind for the sizes.
  attentionOf: (d, l) => `${v4Ratio(l)} ${l < d.hashLayers ? "hash" : "scored"}`,
};

/** A compressor gate's init: twice a linear's std, so its softmax over positions is not flat. */
function gateInit(fanIn: number): SynthInit {
  return { kind: "normal", mean: 0, std: 2 / Math.sqrt(fanIn) };
}

/** GLM-5.3-Flash's tensor prefix. */
const G5N = "model.language_model.";

/** Whether layer `l` of a GLM-5.3-Flash-shaped model is MLA (1-based every mlaEvery-th: 3, 7, …). */
const g5nIsMla = (d: SynthDims, l: number) => (l + 1) % d.mlaEvery === 0;

/** GLM-5.3-Flash's indexer: half the MLA heads (32 at 64), each of the KDA head width. */
const g5nIndexer = (d: SynthDims) => ({
  heads: Math.max(1, Math.round(d.heads / 2)),
  dim: d.kdaHeadDim,
});

/**
 * A matrix [out, in] in GLM-5.3-Flash's FP8 storage when the checkpoint is bf16 (E4M3 codes and
 * an F32 `weight_scale_inv` per 128 × 128 block giving an RMS of about 1/sqrt(in)), else a plain
 * `dt` matrix.
 */
function g5nLinear(name: string, out: number, inp: number, dt: SynthElemType, l: number) {
  return dt === "BF16" ? fp8ScaleInv(name, out, inp, l) : [linear(name, out, inp, dt, l)];
}

/** F32 when the checkpoint is f32, else the trunk's BF16: what the release keeps in BF16. */
const g5nFloat = (dt: SynthElemType): SynthElemType => dt === "F32" ? "F32" : "BF16";

const GLM5_NEXT: Recipe = {
  baseHidden: 4096,
  baseLayers: 45,
  baseExperts: 288,
  baseTopK: 8,
  expertStep: 8,
  maxExperts: 288,
  maxPositions: 1048576,
  width: (h) => {
    // The release at 4096: KDA 64 heads of 128, MLA 64 heads with q_lora 1536, kv_lora 512,
    // qk_nope = v = 256 and no rope, experts of 2048, dense layers of 12288.
    const heads = Math.max(1, h / 64);
    return {
      heads,
      kvHeads: heads,
      kdaHeads: heads,
      kdaHeadDim: Math.round(clamp(h / 32, 16, 128)),
      headDim: Math.round(clamp(h / 16, 16, 256)),
      nopeDim: Math.round(clamp(h / 16, 16, 256)),
      vDim: Math.round(clamp(h / 16, 16, 256)),
      qLoraRank: (3 * h) / 8,
      kvLoraRank: h / 8,
      expertInter: h / 2,
      denseInter: 3 * h,
      sharedExperts: 1,
      mlaEvery: 4,
    };
  },
  counts: (d) => ({
    topK: defaultTopK(d.experts, 8),
    firstDense: Math.min(3, d.layers - 1),
    nGroup: 1,
    topkGroup: 1,
  }),
  config: (d, dtype) => {
    const types = Array.from({ length: d.layers }, (_, l) => l);
    const ix = g5nIndexer(d);
    const text = {
      model_type: "glm5_next_text",
      vocab_size: d.vocab,
      hidden_size: d.hidden,
      intermediate_size: d.denseInter,
      num_hidden_layers: d.layers,
      num_attention_heads: d.heads,
      num_key_value_heads: d.heads,
      first_k_dense_replace: d.firstDense,
      moe_intermediate_size: d.expertInter,
      n_routed_experts: d.experts,
      n_shared_experts: d.sharedExperts,
      num_experts_per_tok: d.topK,
      routed_scaling_factor: 2.5,
      scoring_func: "sigmoid",
      topk_method: "noaux_tc",
      norm_topk_prob: true,
      n_group: 1,
      topk_group: 1,
      swiglu_limit: 10.0,
      hidden_act: "silu",
      mhc: true,
      hc_mult: 4,
      hc_eps: 1e-6,
      hc_sinkhorn_iters: 20,
      mla_use_nope: true,
      q_lora_rank: d.qLoraRank,
      kv_lora_rank: d.kvLoraRank,
      qk_head_dim: d.nopeDim,
      qk_nope_head_dim: d.nopeDim,
      qk_rope_head_dim: 0,
      v_head_dim: d.vDim,
      head_dim: 0,
      attention_bias: false,
      index_n_heads: ix.heads,
      index_head_dim: ix.dim,
      index_topk: 2048,
      index_kpool: 4,
      index_kpool_always_select_tail: true,
      indexer_types: types.map(() => "full"),
      layer_types: types.map((l) =>
        g5nIsMla(d, l) ? "deepseek_sparse_attention" : "linear_attention"
      ),
      mlp_layer_types: types.map((l) => l < d.firstDense ? "dense" : "sparse"),
      linear_attn_config: {
        num_heads: d.kdaHeads,
        head_dim: d.kdaHeadDim,
        short_conv_kernel_size: 4,
        gate_lower_bound: -5.0,
        kda_layers: types.filter((l) => !g5nIsMla(d, l)),
        full_attn_layers: types.filter((l) => g5nIsMla(d, l)),
      },
      num_nextn_predict_layers: 0,
      max_position_embeddings: d.maxPositions,
      rms_norm_eps: 1e-5,
      tie_word_embeddings: false,
      bos_token_id: SYNTH_BOS_ID,
      eos_token_id: SYNTH_EOS_ID,
      dtype: dtype === "bf16" ? "bfloat16" : "float32",
    };
    return {
      architectures: ["Glm5NextForConditionalGeneration"],
      model_type: "glm5_next",
      text_config: text,
      tie_word_embeddings: false,
      dtype: text.dtype,
      ...(dtype === "bf16"
        ? {
          quantization_config: {
            quant_method: "fp8",
            fmt: "e4m3",
            activation_scheme: "dynamic",
            weight_block_size: [128, 128],
          },
        }
        : {}),
    };
  },
  layer: (d, l, dt) => {
    const p = `${G5N}layers.${l}.`, a = p + "self_attn.", b = g5nFloat(dt);
    // Four mHC streams: (2 + 4)·4 mixes before each sublayer.
    const out: SynthTensor[] = [
      ...hyperTensors(`${p}hc_attn_`, 24, 4, d.hidden, l),
      ...hyperTensors(`${p}hc_ffn_`, 24, 4, d.hidden, l),
    ];
    out.push(
      norm(p + "input_layernorm.weight", d.hidden, b, l),
      norm(p + "post_attention_layernorm.weight", d.hidden, b, l),
    );
    if (g5nIsMla(d, l)) {
      const ix = g5nIndexer(d);
      out.push(
        ...g5nLinear(a + "q_a_proj.weight", d.qLoraRank, d.hidden, dt, l),
        norm(a + "q_a_layernorm.weight", d.qLoraRank, b, l),
        ...g5nLinear(a + "q_b_proj.weight", d.heads * d.nopeDim, d.qLoraRank, dt, l),
        ...g5nLinear(a + "kv_a_proj_with_mqa.weight", d.kvLoraRank, d.hidden, dt, l),
        norm(a + "kv_a_layernorm.weight", d.kvLoraRank, b, l),
        linear(a + "kv_b_proj.weight", d.heads * (d.nopeDim + d.vDim), d.kvLoraRank, b, l),
        ...g5nLinear(a + "o_proj.weight", d.hidden, d.heads * d.vDim, dt, l),
        linear(a + "indexer.wq_b.weight", ix.heads * ix.dim, d.qLoraRank, b, l),
        linear(a + "indexer.wk.weight", ix.dim, d.hidden, b, l),
        norm(a + "indexer.k_norm.weight", ix.dim, b, l),
        {
          name: a + "indexer.k_norm.bias",
          shape: [ix.dim],
          dtype: b,
          init: { kind: "normal", mean: 0, std: 0.05 },
          layer: l,
        },
        linear(a + "indexer.weights_proj.weight", ix.heads, d.hidden, b, l),
        f32(a + "indexer.index_kpool_compress_ape", [4, ix.dim], 0, 0.5, l),
        linear(a + "indexer.index_kpool_compress_gate", ix.dim, d.hidden, b, l),
      );
    } else {
      const P = d.kdaHeads * d.kdaHeadDim, D = d.kdaHeadDim;
      for (const x of ["q", "k", "v"]) {
        out.push(
          linear(`${a}${x}_proj.weight`, P, d.hidden, b, l),
          f32(`${a}${x}_conv1d.weight`, [P, 1, 4], 0, 0.5, l),
        );
      }
      out.push(
        linear(a + "f_a_proj.weight", D, d.hidden, b, l),
        linear(a + "f_b_proj.weight", P, D, b, l),
        f32(a + "A_log", [d.kdaHeads], 0, 0.5, l),
        f32(a + "dt_bias", [P], -2, 1.5, l),
        linear(a + "b_proj.weight", d.kdaHeads, d.hidden, b, l),
        linear(a + "g_a_proj.weight", D, d.hidden, b, l),
        linear(a + "g_b_proj.weight", P, D, b, l),
        norm(a + "o_norm.weight", D, b, l),
        linear(a + "o_proj.weight", d.hidden, P, b, l),
      );
    }
    const m = p + "mlp.";
    if (l < d.firstDense) {
      return [
        ...out,
        ...PROJ.flatMap((n, i) =>
          g5nLinear(
            `${m}${n}.weight`,
            i < 2 ? d.denseInter : d.hidden,
            i < 2 ? d.hidden : d.denseInter,
            dt,
            l,
          )
        ),
      ];
    }
    const s = d.expertInter * d.sharedExperts;
    return [
      ...out,
      router(m + "gate.weight", d.experts, d.hidden, b, l),
      f32(m + "gate.e_score_correction_bias", [d.experts], 0, 0, l),
      ...g5nLinear(m + "shared_experts.gate_proj.weight", s, d.hidden, dt, l),
      ...g5nLinear(m + "shared_experts.up_proj.weight", s, d.hidden, dt, l),
      ...g5nLinear(m + "shared_experts.down_proj.weight", d.hidden, s, dt, l),
    ];
  },
  expert: (d, l, e, dt) => {
    const p = `${G5N}layers.${l}.mlp.experts.${e}.`, i = d.expertInter;
    return [
      ...g5nLinear(p + "gate_proj.weight", i, d.hidden, dt, l),
      ...g5nLinear(p + "up_proj.weight", i, d.hidden, dt, l),
      ...g5nLinear(p + "down_proj.weight", d.hidden, i, dt, l),
    ];
  },
  isMoe: (d, l) => l >= d.firstDense,
  minLayers: () => 2,
  globals: (d, dt) => ({
    head: [embedding(`${G5N}embed_tokens.weight`, d, g5nFloat(dt))],
    tail: [
      norm(`${G5N}norm.weight`, d.hidden, g5nFloat(dt), -1),
      linear("lm_head.weight", d.vocab, d.hidden, g5nFloat(dt), -1),
    ],
  }),
  attentionOf: (d, l) => g5nIsMla(d, l) ? "mla" : "kda",
};

/**
 * Gemma 4 MoE (`Gemma4ForConditionalGeneration`, text model only) at Gemma-4-26B-A4B's ratios
 * (hidden 2816, 30 layers of which every 6th full attention, 128 experts top-8 of width 704 beside
 * a dense GELU MLP of 2112, sliding layers 16/8 heads × 256 over a 1,024-token window, full layers
 * 16/2 heads × 512 with V taken from K): the release's nested config and names, fused experts, the
 * embedding tied to the head. Norms multiply by w as stored.
 */
const GEMMA4: Recipe = {
  baseHidden: 2816,
  baseLayers: 30,
  baseExperts: 128,
  baseTopK: 8,
  expertStep: 8,
  maxExperts: 512,
  maxPositions: 262144,
  width: (h) => {
    const headDim = 8 * Math.max(1, Math.round(clamp(h / 11, 16, 256) / 8));
    const { heads, kvHeads } = gqaHeads(Math.max(2, Math.round(h / 176)), 2);
    return {
      headDim,
      heads,
      kvHeads,
      globalHeadDim: 2 * headDim,
      globalKvHeads: Math.max(1, Math.round(heads / 8)),
      fullEvery: 6,
      expertInter: h / 4,
      denseInter: (3 * h) / 4,
    };
  },
  counts: (d) => ({ topK: defaultTopK(d.experts, 8) }),
  config: (d, dtype) => {
    const dt = dtype === "f32" ? "float32" : "bfloat16";
    const text = {
      model_type: "gemma4_text",
      vocab_size: d.vocab,
      hidden_size: d.hidden,
      intermediate_size: d.denseInter,
      moe_intermediate_size: d.expertInter,
      num_hidden_layers: d.layers,
      layer_types: hybridLayerTypes(d, "sliding_attention"),
      num_attention_heads: d.heads,
      num_key_value_heads: d.kvHeads,
      head_dim: d.headDim,
      global_head_dim: d.globalHeadDim,
      num_global_key_value_heads: d.globalKvHeads,
      attention_k_eq_v: true,
      attention_bias: false,
      sliding_window: 1024,
      rope_parameters: {
        full_attention: { rope_type: "proportional", rope_theta: 1e6, partial_rotary_factor: 0.25 },
        sliding_attention: { rope_type: "default", rope_theta: 1e4 },
      },
      num_experts: d.experts,
      top_k_experts: d.topK,
      enable_moe_block: true,
      hidden_activation: "gelu_pytorch_tanh",
      hidden_size_per_layer_input: 0,
      num_kv_shared_layers: 0,
      final_logit_softcapping: 30.0,
      max_position_embeddings: d.maxPositions,
      rms_norm_eps: 1e-6,
      tie_word_embeddings: true,
      bos_token_id: SYNTH_BOS_ID,
      eos_token_id: SYNTH_EOS_ID,
      dtype: dt,
    };
    return {
      architectures: ["Gemma4ForConditionalGeneration"],
      model_type: "gemma4",
      text_config: text,
      tie_word_embeddings: true,
      dtype: dt,
    };
  },
  layer: (d, l, dt) => {
    const p = `${Q35}layers.${l}.`, a = p + "self_attn.";
    const full = q35IsFull(d, l);
    const hd = full ? d.globalHeadDim : d.headDim, kv = (full ? d.globalKvHeads : d.kvHeads) * hd;
    return [
      norm(p + "input_layernorm.weight", d.hidden, dt, l),
      linear(a + "q_proj.weight", d.heads * hd, d.hidden, dt, l),
      linear(a + "k_proj.weight", kv, d.hidden, dt, l),
      // attention_k_eq_v: full layers take V from the k_proj output.
      ...(full ? [] : [linear(a + "v_proj.weight", kv, d.hidden, dt, l)]),
      linear(a + "o_proj.weight", d.hidden, d.heads * hd, dt, l),
      norm(a + "q_norm.weight", hd, dt, l),
      norm(a + "k_norm.weight", hd, dt, l),
      norm(p + "post_attention_layernorm.weight", d.hidden, dt, l),
      norm(p + "pre_feedforward_layernorm.weight", d.hidden, dt, l),
      ...glu(p + "mlp.", PROJ, d.denseInter, d.hidden, dt, l),
      norm(p + "post_feedforward_layernorm_1.weight", d.hidden, dt, l),
      norm(p + "pre_feedforward_layernorm_2.weight", d.hidden, dt, l),
      router(p + "router.proj.weight", d.experts, d.hidden, dt, l),
      norm(p + "router.scale", d.hidden, dt, l),
      norm(p + "router.per_expert_scale", d.experts, dt, l),
      ...stackedExperts(p, d, dt, l),
      norm(p + "post_feedforward_layernorm_2.weight", d.hidden, dt, l),
      norm(p + "post_feedforward_layernorm.weight", d.hidden, dt, l),
      {
        name: p + "layer_scalar",
        shape: [1],
        dtype: dt,
        init: { kind: "normal", mean: 1, std: 0 },
        layer: l,
      },
    ];
  },
  // The experts are stacked per layer (in layer()), not one tensor set per expert.
  expert: () => [],
  isMoe: () => true,
  minLayers: (d) => d.fullEvery,
  globals: (d, dt) => ({
    // The embedding is multiplied by √hidden: std 1/√hidden gives unit-scale rows.
    head: [q35Embedding(d, dt, 1 / Math.sqrt(d.hidden))],
    tail: [norm(`${Q35}norm.weight`, d.hidden, dt, -1)],
  }),
  attentionOf: (d, l) => q35IsFull(d, l) ? "full" : "sliding",
};

/**
 * A weight matrix [out, in] with std about 1/sqrt(in): as `dt`, or under fp8 (dt F8_E4M3) as
 * {@link fp8ScaleInv}.
 */
function maybeFp8(
  name: string,
  out: number,
  inp: number,
  dt: SynthElemType,
  l: number,
): SynthTensor[] {
  return dt === "F8_E4M3" ? fp8ScaleInv(name, out, inp, l) : [linear(name, out, inp, dt, l)];
}

/** The dtype of norms and embeddings: BF16 when the matrices are FP8. */
const plainOf = (dt: SynthElemType): SynthElemType => dt === "F8_E4M3" ? "BF16" : dt;

/**
 * MiniMax-M2 (`MiniMaxM2ForCausalLM`) at its real ratios (hidden 3072, 62 layers, 48/8 heads ×
 * 128 with a 64-wide rotary slice and q/k RMSNorms over the whole projection, 256 experts top-8
 * of width 1536, sigmoid routing with a selection bias, no shared expert, vocab 200,064). Under
 * `--dtype fp8` the matrices are FP8 E4M3 with 128×128 `weight_scale_inv` as released; the
 * router and its bias stay F32, embedding, head and norms BF16.
 */
const MINIMAX_M2: Recipe = {
  baseHidden: 3072,
  baseLayers: 62,
  baseExperts: 256,
  baseTopK: 8,
  expertStep: 8,
  maxExperts: 512,
  maxPositions: 196608,
  width: (h) => {
    const headDim = 8 * Math.max(1, Math.round(clamp(h / 24, 16, 128) / 8));
    return {
      headDim,
      ...gqaHeads(Math.max(2, Math.round(h / 64)), 6),
      ropeDim: headDim / 2,
      expertInter: h / 2,
    };
  },
  counts: (d) => ({ topK: defaultTopK(d.experts, 8) }),
  config: (d, dtype) => ({
    architectures: ["MiniMaxM2ForCausalLM"],
    model_type: "minimax_m2",
    vocab_size: d.vocab,
    hidden_size: d.hidden,
    intermediate_size: d.expertInter,
    num_hidden_layers: d.layers,
    attn_type_list: Array(d.layers).fill(1),
    num_attention_heads: d.heads,
    num_key_value_heads: d.kvHeads,
    head_dim: d.headDim,
    rotary_dim: d.ropeDim,
    rope_theta: 5e6,
    use_qk_norm: true,
    qk_norm_type: "per_layer",
    hidden_act: "silu",
    max_position_embeddings: d.maxPositions,
    rms_norm_eps: 1e-6,
    num_local_experts: d.experts,
    num_experts_per_tok: d.topK,
    scoring_func: "sigmoid",
    use_routing_bias: true,
    shared_intermediate_size: 0,
    use_mtp: false,
    ...(dtype === "fp8"
      ? {
        quantization_config: {
          activation_scheme: "dynamic",
          fmt: "float8_e4m3fn",
          quant_method: "fp8",
          weight_block_size: [128, 128],
          modules_to_not_convert: ["gate", "e_score_correction_bias", "lm_head"],
        },
      }
      : {}),
    ...hfConfigTail(dtype === "f32" ? "f32" : "bf16"),
  }),
  layer: (d, l, dt) => {
    const p = `model.layers.${l}.`, a = p + "self_attn.", b = plainOf(dt);
    const q = d.heads * d.headDim, kv = d.kvHeads * d.headDim;
    return [
      norm(p + "input_layernorm.weight", d.hidden, b, l),
      ...maybeFp8(a + "q_proj.weight", q, d.hidden, dt, l),
      ...maybeFp8(a + "k_proj.weight", kv, d.hidden, dt, l),
      ...maybeFp8(a + "v_proj.weight", kv, d.hidden, dt, l),
      ...maybeFp8(a + "o_proj.weight", d.hidden, q, dt, l),
      norm(a + "q_norm.weight", q, b, l),
      norm(a + "k_norm.weight", kv, b, l),
      norm(p + "post_attention_layernorm.weight", d.hidden, b, l),
      router(p + "block_sparse_moe.gate.weight", d.experts, d.hidden, "F32", l),
      f32(p + "block_sparse_moe.e_score_correction_bias", [d.experts], 0, 0.01, l),
    ];
  },
  expert: (d, l, e, dt) => {
    const p = `model.layers.${l}.block_sparse_moe.experts.${e}.`;
    return [
      ...maybeFp8(p + "w1.weight", d.expertInter, d.hidden, dt, l),
      ...maybeFp8(p + "w2.weight", d.hidden, d.expertInter, dt, l),
      ...maybeFp8(p + "w3.weight", d.expertInter, d.hidden, dt, l),
    ];
  },
  isMoe: () => true,
  minLayers: () => 2,
  globals: (d, dt) => globalTensors(d, plainOf(dt)),
  fp8: true,
};

const RECIPES: Record<SynthArch, Recipe> = {
  qwen3_moe: QWEN3_MOE,
  deepseek_v3: DEEPSEEK_V3,
  mixtral: MIXTRAL,
  glm4_moe: GLM4_MOE,
  gpt_oss: GPT_OSS,
  kimi_k3: KIMI_K3,
  qwen3_5_moe: QWEN3_5_MOE,
  deepseek_v4: DEEPSEEK_V4,
  glm5_next: GLM5_NEXT,
  gemma4: GEMMA4,
  minimax_m2: MINIMAX_M2,
};

/** The recipe of `arch`; throws naming the known architectures when there is none. */
export function recipeOf(arch: string): Recipe {
  if (!Object.hasOwn(RECIPES, arch)) {
    throw new Error(`unknown architecture ${arch}; choose one of ${SYNTH_ARCHS.join(", ")}`);
  }
  return RECIPES[arch as SynthArch];
}

/**
 * Turns a Hugging Face `config.json` (+ `generation_config.json`) into a {@link ModelConfig}.
 * One normaliser per model_type, in a table, so new families (glm4_moe, gpt_oss, kimi_linear) are
 * one entry each. Fields that change the math and have no documented Hugging Face default must be
 * present; missing ones are errors naming the field.
 *
 * @module
 */

import { readJson } from "../io/json_file.ts";
import { existsSync } from "node:fs";
import { join } from "node:path";
import type { ModelConfig, MoeConfig, RopeLayout, RopeScaling } from "../io/model_config.ts";

type Json = Record<string, unknown>;

/** Typed access to one config object; every error names the source and the field. */
class Fields {
  constructor(readonly src: Json, readonly where: string) {}

  has(key: string): boolean {
    return this.src[key] !== undefined && this.src[key] !== null;
  }

  private fail(key: string, expected: string): never {
    throw new Error(
      `${this.where}: field ${key} must be ${expected}, got ${JSON.stringify(this.src[key])}`,
    );
  }

  /** A required positive or non-negative integer. */
  int(key: string, opts: { def?: number; min?: number } = {}): number {
    const v = this.src[key] ?? opts.def;
    if (v === undefined || v === null) {
      throw new Error(`${this.where}: required field ${key} is missing`);
    }
    if (typeof v !== "number" || !Number.isSafeInteger(v) || v < (opts.min ?? 0)) {
      this.fail(key, `an integer >= ${opts.min ?? 0}`);
    }
    return v;
  }

  /** A finite number, required unless a default is given. */
  num(key: string, def?: number): number {
    const v = this.src[key] ?? def;
    if (v === undefined || v === null) {
      throw new Error(`${this.where}: required field ${key} is missing`);
    }
    if (typeof v !== "number" || !Number.isFinite(v)) this.fail(key, "a finite number");
    return v;
  }

  /** A required boolean (no default). */
  flag(key: string): boolean {
    const v = this.src[key];
    if (v === undefined || v === null) {
      throw new Error(`${this.where}: required field ${key} is missing`);
    }
    if (typeof v !== "boolean") this.fail(key, "a boolean");
    return v;
  }

  /** A required nested object. */
  obj(key: string): Fields {
    const v = this.src[key];
    if (v === undefined || v === null) {
      throw new Error(`${this.where}: required field ${key} is missing`);
    }
    if (typeof v !== "object" || Array.isArray(v)) this.fail(key, "an object");
    return new Fields(v as Json, `${this.where} ${key}`);
  }

  /** Requires `key` to be present and equal to `want` (a setting only one value of is supported). */
  exactly(key: string, want: string | number | boolean): void {
    const v = this.src[key];
    if (v === undefined || v === null) {
      throw new Error(`${this.where}: required field ${key} is missing`);
    }
    if (v !== want) {
      throw new Error(
        `${this.where}: field ${key} is ${JSON.stringify(v)}; only ${JSON.stringify(want)} is ` +
          `supported`,
      );
    }
  }

  bool(key: string, def: boolean): boolean {
    const v = this.src[key] ?? def;
    if (typeof v !== "boolean") this.fail(key, "a boolean");
    return v;
  }

  str(key: string, def?: string): string {
    const v = this.src[key] ?? def;
    if (v === undefined || v === null) {
      throw new Error(`${this.where}: required field ${key} is missing`);
    }
    if (typeof v !== "string") this.fail(key, "a string");
    return v;
  }

  /** A list of integers >= 0; missing means empty unless `required`. */
  intList(key: string, required = false): number[] {
    if (required && !this.has(key)) {
      throw new Error(`${this.where}: required field ${key} is missing`);
    }
    const v = this.src[key] ?? [];
    if (!Array.isArray(v) || !v.every((x) => Number.isSafeInteger(x) && x >= 0)) {
      this.fail(key, "a list of integers >= 0");
    }
    return v as number[];
  }
}

/** Default values of Hugging Face's config classes that do not depend on the model's size. */
interface FamilyDefaults {
  ropeTheta: number;
  rmsNormEps: number;
  maxPositions: number;
}

/** Turns one model_type's config into a ModelConfig (bos/eos are filled in afterwards). */
type Normaliser = (f: Fields, modelType: string) => Omit<ModelConfig, "bosId" | "eosIds">;

function requireSilu(f: Fields): void {
  const act = f.str("hidden_act", "silu");
  if (act !== "silu") {
    throw new Error(`${f.where}: hidden_act ${act} is not supported (only silu)`);
  }
}

/** Rope settings in either the classic (`rope_theta` + `rope_scaling`) or the newer
 * (`rope_parameters`) layout of transformers. */
function ropeSource(f: Fields, defaults: FamilyDefaults): { theta: number; scaling: RopeScaling } {
  const params = f.src.rope_parameters;
  let theta: number;
  let raw: unknown;
  if (params && typeof params === "object" && !Array.isArray(params)) {
    const p = new Fields(params as Json, `${f.where} rope_parameters`);
    theta = p.num("rope_theta", f.has("rope_theta") ? f.num("rope_theta") : defaults.ropeTheta);
    raw = params;
  } else {
    theta = f.num("rope_theta", defaults.ropeTheta);
    raw = f.src.rope_scaling;
  }
  return { theta, scaling: resolveRopeScaling(raw, f) };
}

/** Resolves a `rope_scaling` object into a {@link RopeScaling}. */
function resolveRopeScaling(raw: unknown, f: Fields): RopeScaling {
  if (raw === undefined || raw === null) return { type: "none" };
  if (typeof raw !== "object" || Array.isArray(raw)) {
    throw new Error(`${f.where}: field rope_scaling must be an object or null`);
  }
  const r = new Fields(raw as Json, `${f.where} rope_scaling`);
  const type = r.str("rope_type", r.has("type") ? r.str("type") : "default");
  switch (type) {
    case "default":
      return { type: "none" };
    case "linear":
      return { type: "linear", factor: r.num("factor") };
    case "llama3":
      return {
        type: "llama3",
        factor: r.num("factor"),
        lowFreqFactor: r.num("low_freq_factor"),
        highFreqFactor: r.num("high_freq_factor"),
        originalMaxPositions: r.int("original_max_position_embeddings", { min: 1 }),
      };
    case "yarn":
      return {
        type: "yarn",
        factor: r.num("factor"),
        originalMaxPositions: r.int("original_max_position_embeddings", {
          min: 1,
          def: f.has("max_position_embeddings") ? f.int("max_position_embeddings") : undefined,
        }),
        betaFast: r.num("beta_fast", 32),
        betaSlow: r.num("beta_slow", 1),
        mscale: r.num("mscale", 1),
        mscaleAllDim: r.num("mscale_all_dim", 0),
      };
    default:
      throw new Error(
        `${f.where}: rope_scaling type ${type} is not supported (default, linear, llama3, yarn)`,
      );
  }
}

/** Fields shared by all Llama-style (GQA) families. */
function gqaBase(f: Fields, modelType: string, d: FamilyDefaults, opts: { qkNorm: boolean }) {
  requireSilu(f);
  const hidden = f.int("hidden_size", { min: 1 });
  const numHeads = f.int("num_attention_heads", { min: 1 });
  const headDim = f.has("head_dim") ? f.int("head_dim", { min: 1 }) : hidden / numHeads;
  if (!Number.isInteger(headDim)) {
    throw new Error(`${f.where}: hidden_size ${hidden} is not a multiple of num_attention_heads`);
  }
  const numKvHeads = f.int("num_key_value_heads", { def: numHeads, min: 1 });
  if (numHeads % numKvHeads) {
    throw new Error(
      `${f.where}: num_attention_heads ${numHeads} not a multiple of num_key_value_heads`,
    );
  }
  const { theta, scaling } = ropeSource(f, d);
  return {
    family: "llama" as const,
    modelType,
    vocabSize: f.int("vocab_size", { min: 1 }),
    hiddenSize: hidden,
    numLayers: f.int("num_hidden_layers", { min: 1 }),
    numHeads,
    numKvHeads,
    headDim,
    rmsNormEps: f.num("rms_norm_eps", d.rmsNormEps),
    rope: { theta, layout: "half" as RopeLayout, dim: headDim, scaling },
    maxPositions: f.int("max_position_embeddings", { def: d.maxPositions, min: 1 }),
    tieWordEmbeddings: f.bool("tie_word_embeddings", false),
    qkNorm: opts.qkNorm,
    attentionBias: f.bool("attention_bias", false),
    mla: null,
    attnScale: 1 / Math.sqrt(headDim),
  };
}

/** Softmax top-k routing as in Mixtral / Qwen3 (no groups, no bias, no shared expert). */
function softmaxMoe(numExperts: number, topK: number, inter: number, normTopK: boolean): MoeConfig {
  return {
    numExperts,
    topK,
    expertIntermediate: inter,
    scoring: "softmax",
    normTopK,
    routedScaling: 1,
    nGroup: 1,
    topkGroup: 1,
    selectionBias: false,
    sharedIntermediate: 0,
  };
}

function checkTopK(f: Fields, numExperts: number, topK: number): void {
  if (topK < 1 || topK > numExperts) {
    throw new Error(`${f.where}: num_experts_per_tok ${topK} must be in 1..${numExperts}`);
  }
}

const llama: Normaliser = (f, mt) => {
  const base = gqaBase(f, mt, { ropeTheta: 10000, rmsNormEps: 1e-6, maxPositions: 2048 }, {
    qkNorm: false,
  });
  return {
    ...base,
    intermediateSize: f.int("intermediate_size", { min: 1 }),
    layerKinds: Array(base.numLayers).fill("dense"),
    moe: null,
  };
};

const mixtral: Normaliser = (f, mt) => {
  const base = gqaBase(f, mt, { ropeTheta: 1e6, rmsNormEps: 1e-5, maxPositions: 4096 * 32 }, {
    qkNorm: false,
  });
  const numExperts = f.int("num_local_experts", { min: 1 });
  const topK = f.int("num_experts_per_tok", { min: 1 });
  checkTopK(f, numExperts, topK);
  return {
    ...base,
    attentionBias: false,
    intermediateSize: 0,
    layerKinds: Array(base.numLayers).fill("moe"),
    // Mixtral always renormalises the chosen top-k weights.
    moe: softmaxMoe(numExperts, topK, f.int("intermediate_size", { min: 1 }), true),
  };
};

const qwen3Moe: Normaliser = (f, mt) => {
  const base = gqaBase(f, mt, { ropeTheta: 10000, rmsNormEps: 1e-6, maxPositions: 32768 }, {
    qkNorm: true,
  });
  const numExperts = f.int("num_experts", { min: 0 });
  const step = f.int("decoder_sparse_step", { def: 1, min: 1 });
  const mlpOnly = new Set(f.intList("mlp_only_layers"));
  const layerKinds = Array.from(
    { length: base.numLayers },
    (_, l) => !mlpOnly.has(l) && numExperts > 0 && (l + 1) % step === 0 ? "moe" : "dense",
  ) as ("dense" | "moe")[];
  const anyDense = layerKinds.includes("dense");
  const anyMoe = layerKinds.includes("moe");
  let moe: MoeConfig | null = null;
  if (anyMoe) {
    const topK = f.int("num_experts_per_tok", { min: 1 });
    checkTopK(f, numExperts, topK);
    moe = softmaxMoe(
      numExperts,
      topK,
      f.int("moe_intermediate_size", { min: 1 }),
      f.bool("norm_topk_prob", false),
    );
  }
  return {
    ...base,
    intermediateSize: anyDense ? f.int("intermediate_size", { min: 1 }) : 0,
    layerKinds,
    moe,
  };
};

/** yarn_get_mscale of DeepSeek's code: the attention scale multiplier for a YaRN factor. */
function yarnMscale(factor: number, mscale: number): number {
  return factor <= 1 ? 1 : 0.1 * mscale * Math.log(factor) + 1;
}

const deepseekV3: Normaliser = (f, mt) => {
  requireSilu(f);
  const hidden = f.int("hidden_size", { min: 1 });
  const numHeads = f.int("num_attention_heads", { min: 1 });
  const numLayers = f.int("num_hidden_layers", { min: 1 });
  const qkNope = f.int("qk_nope_head_dim", { min: 1 });
  const qkRope = f.int("qk_rope_head_dim", { min: 2 });
  if (qkRope % 2) throw new Error(`${f.where}: qk_rope_head_dim ${qkRope} must be even`);
  const { theta, scaling } = ropeSource(f, {
    ropeTheta: 10000,
    rmsNormEps: 1e-6,
    maxPositions: 4096,
  });
  let attnScale = 1 / Math.sqrt(qkNope + qkRope);
  if (scaling.type === "yarn" && scaling.mscaleAllDim) {
    const m = yarnMscale(scaling.factor, scaling.mscaleAllDim);
    attnScale *= m * m;
  }
  const numExperts = f.has("n_routed_experts") ? f.int("n_routed_experts", { min: 1 }) : 0;
  const firstDense = f.int("first_k_dense_replace", { def: numExperts ? undefined : 0 });
  const freq = f.int("moe_layer_freq", { def: 1, min: 1 });
  const layerKinds = Array.from(
    { length: numLayers },
    (_, l) => numExperts > 0 && l >= firstDense && l % freq === 0 ? "moe" : "dense",
  ) as ("dense" | "moe")[];
  let moe: MoeConfig | null = null;
  if (layerKinds.includes("moe")) {
    const topK = f.int("num_experts_per_tok", { min: 1 });
    checkTopK(f, numExperts, topK);
    const scoring = f.str("scoring_func", "sigmoid");
    if (scoring !== "sigmoid" && scoring !== "softmax") {
      throw new Error(`${f.where}: scoring_func ${scoring} is not supported (sigmoid, softmax)`);
    }
    const topkMethod = f.str("topk_method", "noaux_tc");
    if (!["noaux_tc", "greedy", "group_limited_greedy"].includes(topkMethod)) {
      throw new Error(`${f.where}: topk_method ${topkMethod} is not supported`);
    }
    const grouped = topkMethod !== "greedy";
    const nGroup = grouped ? f.int("n_group", { min: 1 }) : 1;
    const topkGroup = grouped ? f.int("topk_group", { min: 1 }) : 1;
    if (numExperts % nGroup || topkGroup > nGroup) {
      throw new Error(
        `${f.where}: n_group ${nGroup} must divide n_routed_experts ${numExperts} and be >= ` +
          `topk_group ${topkGroup}`,
      );
    }
    const inter = f.int("moe_intermediate_size", { min: 1 });
    moe = {
      numExperts,
      topK,
      expertIntermediate: inter,
      scoring,
      normTopK: f.bool("norm_topk_prob", true),
      routedScaling: f.num("routed_scaling_factor"),
      nGroup,
      topkGroup,
      selectionBias: topkMethod === "noaux_tc",
      sharedIntermediate: inter * f.int("n_shared_experts"),
    };
  }
  const qLora = f.src.q_lora_rank === null ? null : f.int("q_lora_rank", { min: 1 });
  return {
    family: "deepseek_v3",
    modelType: mt,
    vocabSize: f.int("vocab_size", { min: 1 }),
    hiddenSize: hidden,
    numLayers,
    numHeads,
    // MLA: every head has its own k and v (decompressed from the shared latent).
    numKvHeads: numHeads,
    headDim: qkNope + qkRope,
    intermediateSize: layerKinds.includes("dense") ? f.int("intermediate_size", { min: 1 }) : 0,
    rmsNormEps: f.num("rms_norm_eps", 1e-6),
    rope: {
      theta,
      // transformers' rope_interleave defaults to true: the checkpoint's q_pe/k_pe pairs are (2i, 2i+1).
      layout: f.bool("rope_interleave", true) ? "interleaved" : "half",
      dim: qkRope,
      scaling,
    },
    maxPositions: f.int("max_position_embeddings", { def: 4096, min: 1 }),
    tieWordEmbeddings: f.bool("tie_word_embeddings", false),
    qkNorm: false,
    attentionBias: f.bool("attention_bias", false),
    layerKinds,
    moe,
    mla: {
      qLoraRank: qLora,
      kvLoraRank: f.int("kv_lora_rank", { min: 1 }),
      qkNopeHeadDim: qkNope,
      qkRopeHeadDim: qkRope,
      vHeadDim: f.int("v_head_dim", { min: 1 }),
    },
    attnScale,
  };
};

/**
 * Kimi-Linear (`KimiLinearForCausalLM`) as transformers 5.x reads it: `linear_attn_config` with
 * 1-based `full_attn_layers` / `kda_layers` (or `layer_types`), NoPE MLA, DeepSeek-style sigmoid
 * routing with a correction bias under the checkpoint's own key names, dense layers before
 * first_k_dense_replace (transformers ignores moe_layer_freq, and so does this).
 */
const kimiLinear: Normaliser = (f, mt) => {
  requireSilu(f);
  const hidden = f.int("hidden_size", { min: 1 });
  const numHeads = f.int("num_attention_heads", { min: 1 });
  const numLayers = f.int("num_hidden_layers", { min: 1 });
  const qkNope = f.int("qk_nope_head_dim", { min: 1 });
  const qkRope = f.int("qk_rope_head_dim", { min: 2 });
  if (qkRope % 2) throw new Error(`${f.where}: qk_rope_head_dim ${qkRope} must be even`);
  if (!f.bool("mla_use_nope", true)) {
    throw new Error(`${f.where}: mla_use_nope false is not supported (transformers has no rotary)`);
  }
  const lacRaw = f.src.linear_attn_config;
  if (lacRaw === null || typeof lacRaw !== "object" || Array.isArray(lacRaw)) {
    throw new Error(`${f.where}: required field linear_attn_config is missing or not an object`);
  }
  const lac = new Fields(lacRaw as Json, `${f.where} linear_attn_config`);
  const kdaLayers = new Array<boolean>(numLayers).fill(false);
  if (f.has("layer_types")) {
    const types = f.src.layer_types;
    if (!Array.isArray(types) || types.length !== numLayers) {
      throw new Error(`${f.where}: field layer_types must list ${numLayers} layer types`);
    }
    types.forEach((t, i) => {
      if (t !== "linear_attention" && t !== "full_attention") {
        throw new Error(`${f.where}: layer_types[${i}] ${JSON.stringify(t)} is not a layer type`);
      }
      kdaLayers[i] = t === "linear_attention";
    });
  } else {
    const seen = new Set<number>();
    for (const key of ["full_attn_layers", "kda_layers"]) {
      for (const n of lac.intList(key)) {
        if (n < 1 || n > numLayers || seen.has(n)) {
          throw new Error(
            `${lac.where}: ${key} entry ${n} must be a distinct 1-based layer in 1..${numLayers}`,
          );
        }
        seen.add(n);
        kdaLayers[n - 1] = key === "kda_layers";
      }
    }
    if (seen.size !== numLayers) {
      throw new Error(
        `${lac.where}: full_attn_layers and kda_layers must cover all ${numLayers} layers`,
      );
    }
  }
  const kdaHeads = lac.int("num_heads", { min: 1 });
  const kdaDim = lac.int("head_dim", { min: 1 });
  const convKernel = lac.int("short_conv_kernel_size", { min: 1 });
  const numExperts = f.int("num_experts", { min: 1 });
  const firstDense = f.int("first_k_dense_replace", { def: 1 });
  const layerKinds = Array.from(
    { length: numLayers },
    (_, l) => l >= firstDense ? "moe" : "dense",
  ) as ("dense" | "moe")[];
  let moe: MoeConfig | null = null;
  if (layerKinds.includes("moe")) {
    const topK = f.int("num_experts_per_token", { min: 1 });
    checkTopK(f, numExperts, topK);
    const act = f.str("moe_router_activation_func", "sigmoid");
    if (act !== "sigmoid") {
      throw new Error(`${f.where}: moe_router_activation_func ${act} is not supported (sigmoid)`);
    }
    const nGroup = f.int("num_expert_group", { def: 1, min: 1 });
    const topkGroup = f.int("topk_group", { def: 1, min: 1 });
    if (numExperts % nGroup || topkGroup > nGroup) {
      throw new Error(
        `${f.where}: num_expert_group ${nGroup} must divide num_experts ${numExperts} and be >= ` +
          `topk_group ${topkGroup}`,
      );
    }
    const inter = f.int("moe_intermediate_size", { min: 1 });
    moe = {
      numExperts,
      topK,
      expertIntermediate: inter,
      scoring: "sigmoid",
      normTopK: f.bool("moe_renormalize", true),
      routedScaling: f.num("routed_scaling_factor"),
      nGroup,
      topkGroup,
      selectionBias: true,
      sharedIntermediate: inter * f.int("num_shared_experts", { def: 1 }),
    };
  }
  const qLora = f.src.q_lora_rank === null || f.src.q_lora_rank === undefined
    ? null
    : f.int("q_lora_rank", { min: 1 });
  return {
    family: "kimi_linear",
    modelType: mt,
    vocabSize: f.int("vocab_size", { min: 1 }),
    hiddenSize: hidden,
    numLayers,
    numHeads,
    numKvHeads: numHeads,
    headDim: qkNope + qkRope,
    intermediateSize: layerKinds.includes("dense") ? f.int("intermediate_size", { min: 1 }) : 0,
    rmsNormEps: f.num("rms_norm_eps", 1e-6),
    // Unused (NoPE), kept valid so every consumer of a RopeConfig can read it.
    rope: {
      theta: f.num("rope_theta", 10000),
      layout: "half",
      dim: qkRope,
      scaling: { type: "none" },
    },
    maxPositions: f.int("model_max_length", { def: 1048576, min: 1 }),
    tieWordEmbeddings: f.bool("tie_word_embeddings", false),
    qkNorm: false,
    attentionBias: false,
    layerKinds,
    moe,
    mla: {
      qLoraRank: qLora,
      kvLoraRank: f.int("kv_lora_rank", { min: 1 }),
      qkNopeHeadDim: qkNope,
      qkRopeHeadDim: qkRope,
      vHeadDim: f.int("v_head_dim", { min: 1 }),
      nope: true,
    },
    kda: {
      numHeads: kdaHeads,
      headDim: kdaDim,
      convKernel,
      layers: kdaLayers,
      gateLowerBound: null,
    },
    attnScale: 1 / Math.sqrt(qkNope + qkRope),
  };
};

/**
 * Kimi K3 (`KimiK3ForConditionalGeneration`): the language model is under `text_config`. As in
 * kimi-k3-in-c, every field the forward pass depends on must be present; a missing one is an
 * error naming it, and settings with other values than the release's (hidden_act situ, NoPE MLA
 * with an output gate, full-rank KDA gate, sigmoid noaux_tc routing, the latent norm) are refused.
 */
const kimiK3: Normaliser = (top, mt) => {
  const f = top.obj("text_config");
  const lin = f.obj("linear_attn_config");
  f.exactly("hidden_act", "situ");
  f.exactly("mla_use_nope", true);
  f.exactly("mla_use_output_gate", true);
  f.exactly("latent_moe_use_norm", true);
  f.exactly("moe_router_activation_func", "sigmoid");
  f.exactly("topk_method", "noaux_tc");
  f.exactly("num_nextn_predict_layers", 0);
  f.exactly("moe_layer_freq", 1);
  f.exactly("tie_word_embeddings", false);
  lin.exactly("use_full_rank_gate", true);
  const numLayers = f.int("num_hidden_layers", { min: 1 });
  const full = new Set(lin.intList("full_attn_layers", true));
  for (const l of full) {
    if (l < 1 || l > numLayers) {
      throw new Error(
        `${lin.where}: full_attn_layers entry ${l} is outside 1..${numLayers} (1-based)`,
      );
    }
  }
  const firstDense = f.int("first_k_dense_replace");
  const layerKinds = Array.from(
    { length: numLayers },
    (_, l) => l >= firstDense ? "moe" : "dense",
  ) as ("dense" | "moe")[];
  const numExperts = f.int("num_experts", { min: 1 });
  const topK = f.int("num_experts_per_token", { min: 1 });
  checkTopK(f, numExperts, topK);
  const nGroup = f.int("num_expert_group", { min: 1 });
  const topkGroup = f.int("topk_group", { min: 1 });
  if (numExperts % nGroup || topkGroup > nGroup) {
    throw new Error(
      `${f.where}: num_expert_group ${nGroup} must divide num_experts ${numExperts} and be >= ` +
        `topk_group ${topkGroup}`,
    );
  }
  const expertInter = f.int("moe_intermediate_size", { min: 1 });
  const qkNope = f.int("qk_nope_head_dim", { min: 1 });
  const qkRope = f.int("qk_rope_head_dim", { min: 0 });
  const numHeads = f.int("num_attention_heads", { min: 1 });
  return {
    family: "kimi_k3",
    modelType: mt,
    vocabSize: f.int("vocab_size", { min: 1 }),
    hiddenSize: f.int("hidden_size", { min: 1 }),
    numLayers,
    numHeads,
    numKvHeads: numHeads,
    headDim: qkNope + qkRope,
    intermediateSize: layerKinds.includes("dense") ? f.int("intermediate_size", { min: 1 }) : 0,
    rmsNormEps: f.num("rms_norm_eps"),
    // Read but unused (NoPE): the rope dims take part in the scores unrotated.
    rope: { theta: f.num("rope_theta"), layout: "half", dim: qkRope, scaling: { type: "none" } },
    maxPositions: f.int("max_position_embeddings", { min: 1 }),
    tieWordEmbeddings: false,
    qkNorm: false,
    attentionBias: false,
    layerKinds,
    moe: {
      numExperts,
      topK,
      expertIntermediate: expertInter,
      scoring: "sigmoid",
      normTopK: f.flag("moe_renormalize"),
      routedScaling: f.num("routed_scaling_factor"),
      nGroup,
      topkGroup,
      selectionBias: true,
      // The shared experts are stored fused: num_shared_experts × moe_intermediate_size rows.
      sharedIntermediate: expertInter * f.int("num_shared_experts", { min: 0 }),
    },
    mla: {
      qLoraRank: f.int("q_lora_rank", { min: 1 }),
      kvLoraRank: f.int("kv_lora_rank", { min: 1 }),
      qkNopeHeadDim: qkNope,
      qkRopeHeadDim: qkRope,
      vHeadDim: f.int("v_head_dim", { min: 1 }),
      nope: true,
      outputGate: true,
    },
    kda: {
      numHeads: lin.int("num_heads", { min: 1 }),
      headDim: lin.int("head_dim", { min: 1 }),
      convKernel: lin.int("short_conv_kernel_size", { min: 1 }),
      // full_attn_layers is 1-based: layer L (0-based) is MLA when L + 1 is listed.
      layers: Array.from({ length: numLayers }, (_, l) => !full.has(l + 1)),
      gateLowerBound: lin.num("gate_lower_bound"),
      fullRankGate: true,
      aLogPadded: true,
    },
    k3: {
      latentDim: f.int("routed_expert_hidden_size", { min: 1 }),
      situBeta: f.num("activation_situ_beta"),
      situLinearBeta: f.num("activation_situ_linear_beta"),
      attnResBlockSize: f.int("attn_res_block_size", { min: 1 }),
    },
    attnScale: 1 / Math.sqrt(qkNope + qkRope),
  };
};

/** The normaliser of each supported model_type. */
const NORMALISERS: Record<string, Normaliser> = {
  llama,
  mixtral,
  qwen3_moe: qwen3Moe,
  deepseek_v3: deepseekV3,
  // Kimi-K2 ships the DeepSeek-V3 structure under its own model_type.
  kimi_k2: deepseekV3,
  kimi_linear: kimiLinear,
  kimi_k3: kimiK3,
};

/** model_type of each supported `architectures` entry, for configs without a model_type. */
const ARCHITECTURES: Record<string, string> = {
  LlamaForCausalLM: "llama",
  MixtralForCausalLM: "mixtral",
  Qwen3MoeForCausalLM: "qwen3_moe",
  DeepseekV3ForCausalLM: "deepseek_v3",
  KimiLinearForCausalLM: "kimi_linear",
  KimiK3ForConditionalGeneration: "kimi_k3",
};

/** The model_types {@link normalizeConfig} accepts. */
export const SUPPORTED_MODEL_TYPES: readonly string[] = Object.keys(NORMALISERS);

function asObject(v: unknown, where: string): Json {
  if (v === null || typeof v !== "object" || Array.isArray(v)) {
    throw new Error(`${where}: expected a JSON object`);
  }
  return v as Json;
}

/** Picks the config object and model_type to normalise, descending into `text_config`. */
function dispatch(hf: Json, where: string): { cfg: Json; modelType: string; where: string } {
  const mt = hf.model_type;
  if (typeof mt === "string" && Object.hasOwn(NORMALISERS, mt)) {
    return { cfg: hf, modelType: mt, where };
  }
  if (hf.text_config !== undefined && hf.text_config !== null) {
    const inner = asObject(hf.text_config, `${where} text_config`);
    return dispatch(inner, `${where} text_config`);
  }
  const archs = Array.isArray(hf.architectures) ? hf.architectures : [];
  for (const a of archs) {
    if (typeof a === "string" && Object.hasOwn(ARCHITECTURES, a) && mt === undefined) {
      return { cfg: hf, modelType: ARCHITECTURES[a], where };
    }
  }
  throw new Error(
    `${where}: model_type ${JSON.stringify(mt)} (architectures ${JSON.stringify(archs)}) is not ` +
      `supported; supported model_types: ${SUPPORTED_MODEL_TYPES.join(", ")}`,
  );
}

function tokenId(v: unknown, field: string, where: string): number {
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 0) {
    throw new Error(`${where}: field ${field} must be a token id, got ${JSON.stringify(v)}`);
  }
  return v;
}

/**
 * Normalises a parsed Hugging Face config (and optional generation config) into a ModelConfig.
 * bos/eos come from the generation config when it sets them, else from the config.
 */
export function normalizeConfig(
  hf: unknown,
  generation?: unknown,
  where = "config.json",
): ModelConfig {
  const top = asObject(hf, where);
  const { cfg, modelType, where: at } = dispatch(top, where);
  const base = NORMALISERS[modelType](new Fields(cfg, at), modelType);
  const gen = generation === undefined || generation === null
    ? {}
    : asObject(generation, "generation_config.json");
  const pick = (key: string): { v: unknown; from: string } => {
    if (gen[key] !== undefined && gen[key] !== null) {
      return { v: gen[key], from: "generation_config.json" };
    }
    if (cfg[key] !== undefined && cfg[key] !== null) return { v: cfg[key], from: at };
    return { v: top[key], from: where };
  };
  const bos = pick("bos_token_id");
  const eos = pick("eos_token_id");
  const eosList = eos.v === undefined || eos.v === null
    ? []
    : Array.isArray(eos.v)
    ? eos.v
    : [eos.v];
  const cfgOut: ModelConfig = {
    ...base,
    bosId: bos.v === undefined || bos.v === null ? null : tokenId(bos.v, "bos_token_id", bos.from),
    eosIds: eosList.map((v) => tokenId(v, "eos_token_id", eos.from)),
  };
  for (const id of [cfgOut.bosId ?? 0, ...cfgOut.eosIds]) {
    if (id >= cfgOut.vocabSize) {
      throw new Error(
        `${where}: special token id ${id} is outside the vocabulary of ${cfgOut.vocabSize}`,
      );
    }
  }
  return cfgOut;
}

/** Reads `config.json` (and `generation_config.json` when present) of a checkpoint directory. */
export function loadModelConfig(dir: string): ModelConfig {
  const cfgPath = join(dir, "config.json");
  const genPath = join(dir, "generation_config.json");
  const gen = existsSync(genPath) ? readJson(genPath) : undefined;
  return normalizeConfig(readJson(cfgPath), gen, cfgPath);
}

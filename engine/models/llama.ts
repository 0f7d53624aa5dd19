/**
 * The llama family: grouped-query attention with RoPE and a float32 KV cache, for Llama, Mixtral
 * and Qwen3-MoE (optional q/k/v biases; Qwen3's per-head q/k RMSNorm runs before RoPE). This file
 * holds everything about the family: how each model_type's config.json normalises, the attention
 * tensors and their Hugging Face names, the planner's sizes, the stored-config check, the engine's
 * attention, and the pointer to its float64 reference (engine/reference/gqa.ts).
 *
 * @module
 */
import type { LayerTensor, ModelConfig, MoeConfig, RopeLayout } from "../../io/model_config.ts";
import type { Arena } from "../arena.ts";
import type { AttentionShape, Ops } from "../ops.ts";
import { gqaReference } from "../reference/gqa.ts";
import { buildRopeTable, ropeAt, type RopeTable } from "../rope_table.ts";
import type { LayerWeights } from "../weights.ts";
import type { Family, MoeNaming } from "./family.ts";
import {
  checkTopK,
  type FamilyDefaults,
  type Fields,
  type Normaliser,
  requireSilu,
  ropeSource,
  softmaxMoe,
} from "./hf_config.ts";

/** Attention of every layer of one model, with its KV cache and scratch. */
export class GqaAttention {
  #ops: Ops;
  #cfg: ModelConfig;
  #rope: RopeTable;
  #k: number[] = [];
  #v: number[] = [];
  #q: number;
  #kNew: number;
  #vNew: number;
  #att: number;
  #scores: number;
  #scoreTokens: number;
  #maxCtx: number;
  #shape: AttentionShape;

  constructor(ops: Ops, arena: Arena, cfg: ModelConfig, maxBatch: number, maxCtx: number) {
    this.#ops = ops;
    this.#cfg = cfg;
    this.#maxCtx = maxCtx;
    const hd = cfg.headDim;
    const kvDim = cfg.numKvHeads * hd;
    for (let l = 0; l < cfg.numLayers; l++) {
      // One region per layer, sized by the function the planner sums: keys, then values.
      const kv = arena.alloc(`kv cache L${l}`, LLAMA.stateBytes(cfg, l, maxCtx));
      this.#k.push(kv);
      this.#v.push(kv + maxCtx * kvDim * 4);
    }
    this.#rope = buildRopeTable(arena, cfg.rope, maxCtx);
    this.#q = arena.alloc("attn q", maxBatch * cfg.numHeads * hd * 4);
    this.#kNew = arena.alloc("attn k", maxBatch * kvDim * 4);
    this.#vNew = arena.alloc("attn v", maxBatch * kvDim * 4);
    this.#att = arena.alloc("attn out", maxBatch * cfg.numHeads * hd * 4);
    this.#scoreTokens = Math.min(maxBatch, 8);
    this.#scores = arena.alloc("attn scores", this.#scoreTokens * cfg.numHeads * maxCtx * 4);
    this.#shape = {
      nHeads: cfg.numHeads,
      nKvHeads: cfg.numKvHeads,
      headDim: hd,
      vHeadDim: hd,
      kStride: kvDim,
      vStride: kvDim,
      scale: cfg.attnScale,
    };
  }

  /** out = o_proj(attention(h)) for `nb` tokens at positions pos.. pos+nb−1. */
  forward(layer: number, lw: LayerWeights, h: number, out: number, nb: number, pos: number): void {
    const ops = this.#ops;
    const cfg = this.#cfg;
    if (pos + nb > this.#maxCtx) {
      throw new Error(`context full: ${pos + nb} > ${this.#maxCtx} positions`);
    }
    const hd = cfg.headDim;
    const qDim = cfg.numHeads * hd;
    const kvDim = cfg.numKvHeads * hd;
    ops.matmul(
      { w: lw.get("wq"), x: h, y: this.#q, nb },
      { w: lw.get("wk"), x: h, y: this.#kNew, nb },
      { w: lw.get("wv"), x: h, y: this.#vNew, nb },
    );
    if (cfg.attentionBias) {
      for (let b = 0; b < nb; b++) {
        ops.add(this.#q + b * qDim * 4, lw.get("bq").ptr, qDim);
        ops.add(this.#kNew + b * kvDim * 4, lw.get("bk").ptr, kvDim);
        ops.add(this.#vNew + b * kvDim * 4, lw.get("bv").ptr, kvDim);
      }
    }
    if (cfg.qkNorm) {
      ops.rmsnorm(this.#q, lw.get("q_norm").ptr, this.#q, hd, nb * cfg.numHeads, cfg.rmsNormEps);
      ops.rmsnorm(
        this.#kNew,
        lw.get("k_norm").ptr,
        this.#kNew,
        hd,
        nb * cfg.numKvHeads,
        cfg.rmsNormEps,
      );
    }
    const interleaved = cfg.rope.layout === "interleaved";
    const lengths: number[] = [];
    for (let b = 0; b < nb; b++) {
      const [cos, sin] = ropeAt(this.#rope, pos + b);
      ops.rope(this.#q + b * qDim * 4, cfg.numHeads, hd, cfg.rope.dim, cos, sin, interleaved);
      ops.rope(this.#kNew + b * kvDim * 4, cfg.numKvHeads, hd, cfg.rope.dim, cos, sin, interleaved);
      lengths.push(pos + b + 1);
    }
    ops.copy(this.#k[layer] + pos * kvDim * 4, this.#kNew, nb * kvDim);
    ops.copy(this.#v[layer] + pos * kvDim * 4, this.#vNew, nb * kvDim);
    ops.attention({
      shape: this.#shape,
      q: this.#q,
      qStride: qDim,
      k: this.#k[layer],
      v: this.#v[layer],
      out: this.#att,
      outStride: qDim,
      scores: this.#scores,
      scoresPerToken: cfg.numHeads * this.#maxCtx,
      scoreTokens: this.#scoreTokens,
      lengths,
    });
    ops.matmul({ w: lw.get("wo"), x: this.#att, y: out, nb });
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

/** Llama (dense). */
export const normaliseLlama: Normaliser = (f, mt) => {
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

/** Mixtral: every layer MoE, softmax top-k, always renormalised. */
export const normaliseMixtral: Normaliser = (f, mt) => {
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

/** Qwen3-MoE: q/k norms, MoE every decoder_sparse_step layers except mlp_only_layers. */
export const normaliseQwen3Moe: Normaliser = (f, mt) => {
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

/** The llama family. */
export const LLAMA: Family = {
  name: "llama",
  attentionTensors(cfg) {
    const names: Partial<Record<LayerTensor, string>> = {
      wq: "self_attn.q_proj.weight",
      wk: "self_attn.k_proj.weight",
      wv: "self_attn.v_proj.weight",
      wo: "self_attn.o_proj.weight",
    };
    if (cfg.attentionBias) {
      for (const b of ["q", "k", "v"] as const) names[`b${b}`] = `self_attn.${b}_proj.bias`;
    }
    if (cfg.qkNorm) {
      names.q_norm = "self_attn.q_norm.weight";
      names.k_norm = "self_attn.k_norm.weight";
    }
    return names;
  },
  validateConfig(c, where) {
    if (c.mla !== null) throw new Error(`${where}.mla: the llama family has no MLA section`);
  },
  stateBytes: (cfg, _layer, ctx) => ctx * 2 * cfg.numKvHeads * cfg.headDim * 4,
  scratchFloats: (cfg, maxBatch) =>
    maxBatch * (3 * cfg.numHeads * cfg.headDim + 2 * cfg.numKvHeads * cfg.headDim),
  persistentBytes: () => 0,
  createAttention: (ops, arena, cfg, maxBatch, maxCtx) =>
    new GqaAttention(ops, arena, cfg, maxBatch, maxCtx),
  reference: gqaReference,
};

/** Experts named `experts.E.{gate,up,down}_proj` under `mlp.` (Llama-style, Qwen3, DeepSeek). */
export const MLP_NAMING: MoeNaming = {
  moe: "mlp",
  expert: { gate: "gate_proj", up: "up_proj", down: "down_proj" },
};

/** Mixtral's naming: `block_sparse_moe.experts.E.{w1,w3,w2}`. */
export const MIXTRAL_NAMING: MoeNaming = {
  moe: "block_sparse_moe",
  expert: { gate: "w1", up: "w3", down: "w2" },
};
